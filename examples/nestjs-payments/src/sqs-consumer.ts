/*
 * The SQS variant of the consumer.  An outbox_pg sqs destination sends
 * the payload as the message body and the event's id as the message_id
 * message attribute (ask for it: MessageAttributeNames ["message_id"]).
 * The loop, with the AWS SDK's SQSClient:
 *
 *     const { Messages = [] } = await sqs.send(new ReceiveMessageCommand({
 *         QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 20,
 *         MessageAttributeNames: ['message_id'] }));
 *     for (const m of Messages) {
 *         await applySqsMessage(ledger, m);           // commits first
 *         await sqs.send(new DeleteMessageCommand({ QueueUrl, ReceiptHandle: m.ReceiptHandle }));
 *     }
 *
 * Delete only after the commit: a crash in between redelivers a message
 * whose claim exists, which is then deleted without being applied twice.
 */

import type { PaymentCreated } from './events.js';
import type { LedgerService } from './ledger.service.js';

/* The fields of an SQS message this consumer reads. */
export interface SqsMessage {
	MessageId?: string;
	Body?: string;
	MessageAttributes?: Record<string, { StringValue?: string; DataType?: string }>;
}

/* true when applied now, false for a message applied before */
export async function applySqsMessage(ledger: LedgerService, message: SqsMessage): Promise<boolean> {
	const id = message.MessageAttributes?.message_id?.StringValue;

	/* SQS's own MessageId differs per send: it cannot dedupe a redelivery */
	if (id === undefined)
		throw new Error('the message has no message_id attribute (request MessageAttributeNames ["message_id"])');
	return ledger.apply(id, JSON.parse(message.Body ?? 'null') as PaymentCreated, 'sqs');
}
