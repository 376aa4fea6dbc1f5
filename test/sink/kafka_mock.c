/*
 * kafka_mock.c - a Kafka cluster for the TAP tests: librdkafka's mock
 * cluster (rdkafka_mock.h), in a process of its own.
 *
 *	kafka_mock STATEFILE COMMANDFIFO TOPIC[,TOPIC...]
 *
 * Starts a one-broker mock cluster with the topics (3 partitions each),
 * writes its bootstrap address ("127.0.0.1:port") and a newline to
 * STATEFILE, then reads commands, one per line, from COMMANDFIFO and
 * appends "ok N" (N: the command's number) or "error N" to STATEFILE.ack
 * once a command took effect.  It stays up until killed.
 *
 *	produce_errors COUNT CODE	the next COUNT Produce requests fail with
 *								the Kafka error CODE
 *	request_errors API COUNT CODE	the same for the requests of API key API
 *								(22: InitProducerId)
 *	topic_error TOPIC CODE		metadata reports CODE for TOPIC (0: none)
 *	down						the broker goes down (connections closed,
 *								new ones refused)
 *	up							the broker comes back
 *	rtt MS						the broker answers every request MS
 *								milliseconds late (0: at once)
 *
 * Built by the TAP test with the system compiler and -lrdkafka; uses only
 * the API of librdkafka 2.0.2 (Debian 12).  The mock keeps about 5 MiB per
 * partition and drops older data: tests keep their messages small.
 */
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PRODUCE_API_KEY 0
#define MAX_ERRORS 1000

static void
ack(const char *path, const char *what, int n)
{
	FILE	   *f = fopen(path, "a");

	if (f == NULL)
		return;
	fprintf(f, "%s %d\n", what, n);
	fclose(f);
}

int
main(int argc, char **argv)
{
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	rd_kafka_mock_cluster_t *mc;
	char		errstr[512];
	char		ackpath[4096];
	char		line[1024];
	char	   *topics;
	FILE	   *state;
	FILE	   *cmds;
	int			n = 0;
	int			api;

	if (argc != 4)
	{
		fprintf(stderr, "usage: %s STATEFILE COMMANDFIFO TOPIC[,TOPIC...]\n", argv[0]);
		return 2;
	}
	snprintf(ackpath, sizeof(ackpath), "%s.ack", argv[1]);

	/* a handle only to own the cluster: it never connects anywhere */
	conf = rd_kafka_conf_new();
	rd_kafka_conf_set(conf, "log_level", "3", NULL, 0);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
	{
		fprintf(stderr, "kafka_mock: %s\n", errstr);
		return 1;
	}
	mc = rd_kafka_mock_cluster_new(rk, 1);
	if (mc == NULL)
	{
		fprintf(stderr, "kafka_mock: could not create the mock cluster\n");
		return 1;
	}
	topics = strdup(argv[3]);
	for (char *t = strtok(topics, ","); t != NULL; t = strtok(NULL, ","))
	{
		if (rd_kafka_mock_topic_create(mc, t, 3, 1) != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			fprintf(stderr, "kafka_mock: could not create topic %s\n", t);
			return 1;
		}
	}

	state = fopen(argv[1], "w");
	if (state == NULL)
	{
		perror("kafka_mock: state file");
		return 1;
	}
	fprintf(state, "%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fclose(state);

	/* read-write: the FIFO never reads as closed between writers */
	cmds = fopen(argv[2], "r+");
	if (cmds == NULL)
	{
		perror("kafka_mock: command FIFO");
		return 1;
	}
	while (fgets(line, sizeof(line), cmds) != NULL)
	{
		char		word[64];
		char		arg[512];
		int			a;
		int			b;
		bool		ok = true;

		n++;
		api = PRODUCE_API_KEY;
		if ((sscanf(line, "produce_errors %d %d", &a, &b) == 2 ||
			 sscanf(line, "request_errors %d %d %d", &api, &a, &b) == 3) &&
			a > 0 && a <= MAX_ERRORS)
		{
			rd_kafka_resp_err_t errs[MAX_ERRORS];

			for (int i = 0; i < a; i++)
				errs[i] = (rd_kafka_resp_err_t) b;
			rd_kafka_mock_push_request_errors_array(mc, api, a, errs);
		}
		else if (sscanf(line, "topic_error %511s %d", arg, &b) == 2)
			rd_kafka_mock_topic_set_error(mc, arg, (rd_kafka_resp_err_t) b);
		else if (sscanf(line, "rtt %d", &a) == 1 && a >= 0)
			ok = rd_kafka_mock_broker_set_rtt(mc, 1, a) == RD_KAFKA_RESP_ERR_NO_ERROR;
		else if (sscanf(line, "%63s", word) == 1 && strcmp(word, "down") == 0)
			ok = rd_kafka_mock_broker_set_down(mc, 1) == RD_KAFKA_RESP_ERR_NO_ERROR;
		else if (sscanf(line, "%63s", word) == 1 && strcmp(word, "up") == 0)
			ok = rd_kafka_mock_broker_set_up(mc, 1) == RD_KAFKA_RESP_ERR_NO_ERROR;
		else
			ok = false;
		ack(ackpath, ok ? "ok" : "error", n);
	}
	return 0;
}
