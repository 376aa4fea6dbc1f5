/*
 * slow_resolver.c - an LD_PRELOAD shim for the TAP tests: a DNS server
 * that takes its time, for one name.
 *
 *	SLOW_RESOLVER_NAME=slow.test SLOW_RESOLVER_SECONDS=10 LD_PRELOAD=...so
 *
 * getaddrinfo() of that name sleeps that long, then resolves 127.0.0.1;
 * every other name is resolved as usual.  Built by the TAP test with the
 * system compiler (cc -shared -fPIC ... -ldl).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int (*getaddrinfo_fn) (const char *, const char *,
							   const struct addrinfo *, struct addrinfo **);

int
getaddrinfo(const char *node, const char *service,
			const struct addrinfo *hints, struct addrinfo **res)
{
	static getaddrinfo_fn real = NULL;
	const char *slow = getenv("SLOW_RESOLVER_NAME");
	const char *seconds = getenv("SLOW_RESOLVER_SECONDS");

	if (real == NULL)
		real = (getaddrinfo_fn) dlsym(RTLD_NEXT, "getaddrinfo");
	if (node != NULL && slow != NULL && strcmp(node, slow) == 0)
	{
		sleep(seconds ? (unsigned) atoi(seconds) : 10);
		node = "127.0.0.1";
	}
	return real(node, service, hints, res);
}
