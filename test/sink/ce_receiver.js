#!/usr/bin/env node
// A webhook receiver for outbox_pg's CloudEvents test (test/t/054): every
// request is parsed by the official JavaScript SDK (npm cloudevents,
// HTTP.toEvent), as a consumer using it would, and what the SDK made of
// it is appended to the log as one JSON line:
//   { mode, content_type, id, type, source, subject, time, specversion,
//     datacontenttype, traceparent, data }
// (mode: "structured" or "binary", by Content-Type), or { error, ... } when
// the SDK refused the request.  Answers 204 either way, so the relay never
// retries and each request is logged once.
//
//   NODE_PATH=/opt/outbox_pg-test/node/node_modules \
//     node test/sink/ce_receiver.js PORT LOGFILE
'use strict';

const fs = require('fs');
const http = require('http');
const { HTTP } = require('cloudevents');

const port = Number(process.argv[2]);
const log = process.argv[3];

const server = http.createServer((req, res) => {
	const chunks = [];
	req.on('data', (c) => chunks.push(c));
	req.on('end', () => {
		const body = Buffer.concat(chunks).toString('utf8');
		const contentType = req.headers['content-type'] || '';
		const rec = {
			mode: contentType.startsWith('application/cloudevents+json') ? 'structured' : 'binary',
			content_type: contentType,
			ce_subject_header: req.headers['ce-subject'] ?? null,
		};
		try {
			const ev = HTTP.toEvent({ headers: req.headers, body });
			for (const k of ['id', 'type', 'source', 'subject', 'time', 'specversion',
				'datacontenttype', 'traceparent', 'data'])
				rec[k] = ev[k] ?? null;
		} catch (e) {
			rec.error = String(e && e.message ? e.message : e);
			rec.body = body;
		}
		fs.appendFileSync(log, JSON.stringify(rec) + '\n');
		res.writeHead(204);
		res.end();
	});
});

server.listen(port, '127.0.0.1', () => console.log('listening'));
