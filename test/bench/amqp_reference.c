/*
 * amqp_reference.c
 *		The broker's own limit for the AMQP row of test/bench/run brokers:
 *		a plain rabbitmq-c publisher with publisher confirms, no database,
 *		sending messages shaped like the relay's (persistent, mandatory,
 *		message_id, type, content_type, app_id, timestamp and four string
 *		headers, the same payload) with a window of unconfirmed publishes.
 *
 * Usage: amqp_reference host port exchange routing_key payload count
 *		  window connections
 * Each connection is a process of its own publishing count / connections
 * messages; prints the messages confirmed per second over all of them.
 *
 *		  amqp_reference consume host port queue
 * consumes the queue until killed, acknowledging every 100 messages
 * (prefetch 1,000), as an application reading it would: the rows measure
 * a queue that is being read, not one that only grows (RabbitMQ takes
 * messages more slowly the more a classic queue holds).
 *
 * A benchmark helper, not a test.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include) && __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/framing.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#endif

static void
die(const char *what)
{
	fprintf(stderr, "amqp_reference: %s\n", what);
	exit(1);
}

static void
check_reply(amqp_rpc_reply_t r, const char *what)
{
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
		die(what);
}

static amqp_connection_state_t
open_channel(const char *host, int port)
{
	amqp_connection_state_t conn = amqp_new_connection();
	amqp_socket_t *sock = amqp_tcp_socket_new(conn);

	if (sock == NULL || amqp_socket_open(sock, host, port) != AMQP_STATUS_OK)
		die("cannot connect");
	check_reply(amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
						   "guest", "guest"), "login");
	amqp_channel_open(conn, 1);
	check_reply(amqp_get_rpc_reply(conn), "channel.open");
	return conn;
}

static int
consume(const char *host, int port, const char *queue)
{
	amqp_connection_state_t conn = open_channel(host, port);
	uint64_t	unacked = 0;

	amqp_basic_qos(conn, 1, 0, 1000, 0);
	check_reply(amqp_get_rpc_reply(conn), "basic.qos");
	amqp_basic_consume(conn, 1, amqp_cstring_bytes(queue), amqp_empty_bytes,
					   0, 0, 0, amqp_empty_table);
	check_reply(amqp_get_rpc_reply(conn), "basic.consume");
	for (;;)
	{
		amqp_envelope_t envelope;
		amqp_rpc_reply_t r;

		amqp_maybe_release_buffers(conn);
		r = amqp_consume_message(conn, &envelope, NULL, 0);
		if (r.reply_type != AMQP_RESPONSE_NORMAL)
			die("consume");
		if (++unacked >= 100)
		{
			if (amqp_basic_ack(conn, 1, envelope.delivery_tag, 1) != AMQP_STATUS_OK)
				die("ack");
			unacked = 0;
		}
		amqp_destroy_envelope(&envelope);
	}
	return 0;
}

static int
publish_all(const char *host, int port, const char *exchange,
			const char *key, const char *payload, long count, int window)
{
	amqp_connection_state_t conn = open_channel(host, port);
	amqp_table_entry_t entries[4];
	amqp_basic_properties_t props;
	long		sent = 0,
				confirmed = 0;
	char		id[40];

	amqp_confirm_select(conn, 1);
	check_reply(amqp_get_rpc_reply(conn), "confirm.select");

	entries[0].key = amqp_cstring_bytes("destination");
	entries[1].key = amqp_cstring_bytes("aggregate_id");
	entries[2].key = amqp_cstring_bytes("traceparent");
	entries[3].key = amqp_cstring_bytes("time");
	for (int i = 0; i < 4; i++)
		entries[i].value.kind = AMQP_FIELD_KIND_UTF8;
	entries[0].value.value.bytes = amqp_cstring_bytes("amqp");
	entries[1].value.value.bytes = amqp_cstring_bytes("42");
	entries[2].value.value.bytes =
		amqp_cstring_bytes("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
	entries[3].value.value.bytes = amqp_cstring_bytes("2026-12-04T22:00:00.000000Z");

	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		AMQP_BASIC_MESSAGE_ID_FLAG | AMQP_BASIC_TYPE_FLAG |
		AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_HEADERS_FLAG |
		AMQP_BASIC_TIMESTAMP_FLAG;
	props.content_type = amqp_cstring_bytes("application/json");
	props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
	props.type = amqp_cstring_bytes("bench.event");
	props.app_id = amqp_cstring_bytes("outbox_pg");
	props.headers.num_entries = 4;
	props.headers.entries = entries;
	props.timestamp = (uint64_t) time(NULL);

	while (confirmed < count)
	{
		amqp_frame_t frame;

		while (sent < count && sent - confirmed < window)
		{
			snprintf(id, sizeof(id), "%d-%ld", (int) getpid(), sent);
			props.message_id = amqp_cstring_bytes(id);
			if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(exchange),
								   amqp_cstring_bytes(key), 1, 0, &props,
								   amqp_cstring_bytes(payload)) != AMQP_STATUS_OK)
				die("publish");
			sent++;
		}
		if (amqp_simple_wait_frame(conn, &frame) != AMQP_STATUS_OK)
			die("wait");
		if (frame.frame_type != AMQP_FRAME_METHOD)
			continue;
		if (frame.payload.method.id == AMQP_BASIC_ACK_METHOD)
		{
			amqp_basic_ack_t *m = frame.payload.method.decoded;

			/* tags are 1-based: tag n confirms the n-th publish */
			if ((long) m->delivery_tag > confirmed)
				confirmed = m->multiple ? (long) m->delivery_tag : confirmed + 1;
		}
		else if (frame.payload.method.id == AMQP_BASIC_NACK_METHOD)
			die("nacked");
		amqp_maybe_release_buffers(conn);
	}
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return 0;
}

int
main(int argc, char **argv)
{
	long		count;
	int			window,
				connections;
	struct timeval t0,
				t1;
	int			failed = 0;

	if (argc == 5 && strcmp(argv[1], "consume") == 0)
		return consume(argv[2], atoi(argv[3]), argv[4]);
	if (argc != 9)
		die("usage: amqp_reference host port exchange routing_key payload count window connections\n"
			"       amqp_reference consume host port queue");
	count = atol(argv[6]);
	window = atoi(argv[7]);
	connections = atoi(argv[8]);
	gettimeofday(&t0, NULL);
	for (int i = 0; i < connections; i++)
	{
		if (fork() == 0)
			_exit(publish_all(argv[1], atoi(argv[2]), argv[3], argv[4], argv[5],
							  count / connections, window));
	}
	for (int i = 0; i < connections; i++)
	{
		int			status;

		wait(&status);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed = 1;
	}
	gettimeofday(&t1, NULL);
	if (failed)
		die("a publisher failed");
	printf("%.0f\n", (count / connections * connections) /
		   ((t1.tv_sec - t0.tv_sec) + (t1.tv_usec - t0.tv_usec) / 1e6));
	return 0;
}
