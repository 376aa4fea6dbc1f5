/*
 * POST /payments {"amount": 1250, "currency": "EUR"} -> the payment's id
 * and the id of its payment.created event.
 */

import { BadRequestException, Body, Controller, Post } from '@nestjs/common';

import { PaymentsService } from './payments.service.js';

@Controller('payments')
export class PaymentsController {
	constructor(private readonly payments: PaymentsService) {}

	@Post()
	async create(@Body() body: { amount?: unknown; currency?: unknown }): Promise<{ id: string; eventId: string }> {
		const { amount, currency } = body ?? {};

		if (!Number.isSafeInteger(amount) || (amount as number) <= 0)
			throw new BadRequestException('amount must be a positive integer (minor units)');
		if (typeof currency !== 'string' || !/^[A-Z]{3}$/.test(currency))
			throw new BadRequestException('currency must be an ISO 4217 code');
		const { payment, eventId } = await this.payments.create(amount as number, currency);

		return { id: payment.id, eventId };
	}
}
