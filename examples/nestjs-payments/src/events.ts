/*
 * The events this service publishes, each with its payload type.
 */

import { defineEvents } from '@outbox-pg/client';

export interface PaymentCreated {
	paymentId: string;
	amount: number;
	currency: string;
}

export const events = defineEvents<{
	'payment.created': PaymentCreated;
}>();
