/*
 * The webhook consumer: outbox_pg's relay POSTs each event here, signed the
 * Standard Webhooks way.  The signature is checked over the raw body (the
 * standardwebhooks package, with the destination's secret), then the
 * payment is applied once per message id (webhook-id, the event's id): a
 * redelivery is answered 200 without applying it again.  Any other answer
 * makes the relay retry.
 */

import { Controller, Headers, HttpCode, Inject, Post, Req, UnauthorizedException } from '@nestjs/common';
import type { RawBodyRequest } from '@nestjs/common';
import type { Request } from 'express';
import { Webhook } from 'standardwebhooks';

import type { PaymentCreated } from './events.js';
import { LedgerService } from './ledger.service.js';

export const WEBHOOK_SECRET = 'WEBHOOK_SECRET';

@Controller('webhooks')
export class WebhooksController {
	private readonly webhook: Webhook;

	constructor(private readonly ledger: LedgerService, @Inject(WEBHOOK_SECRET) secret: string) {
		this.webhook = new Webhook(secret);
	}

	@Post('payments')
	@HttpCode(200)
	async payment(@Req() req: RawBodyRequest<Request>,
				  @Headers() headers: Record<string, string>): Promise<{ applied: boolean }> {
		let payment: PaymentCreated;

		try {
			payment = this.webhook.verify(req.rawBody ?? '', headers) as PaymentCreated;
		}
		catch {
			throw new UnauthorizedException('invalid webhook signature');
		}
		return { applied: await this.ledger.apply(headers['webhook-id'] as string, payment, 'webhook') };
	}
}
