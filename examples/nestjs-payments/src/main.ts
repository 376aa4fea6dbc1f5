/*
 * node dist/src/main.js: the service on PORT (default 3000), with the
 * webhook secret from WEBHOOK_SECRET and the database from the PG*
 * variables.
 */

import { createApp } from './app.js';

const secret = process.env.WEBHOOK_SECRET;

if (!secret)
{
	console.error('set WEBHOOK_SECRET to the destination\'s signing secret (whsec_...)');
	process.exit(2);
}
const app = await createApp({ webhookSecret: secret, synchronize: process.env.SYNCHRONIZE === '1' });

await app.listen(Number(process.env.PORT ?? 3000));
