/*
 * clock_shift.c: an LD_PRELOAD library for tests that shifts a process's
 * wall clock (gettimeofday, time, clock_gettime of the realtime clocks) by
 * the number of seconds written in the file CLOCK_SHIFT_FILE names, read
 * again at most every 20 ms.  CLOCK_MONOTONIC is left alone, as a real step
 * of the clock leaves it.  test/t/078_clock_step.pl builds it with cc.
 *
 * libfaketime does the same, but it keeps a pointer to its file's name in
 * the environment's original memory, which PostgreSQL overwrites with each
 * process's title: a child of the postmaster never read the file again.
 * Here the name is copied at load.  Only async-signal-safe calls (open,
 * read, close) read the file: PostgreSQL reads the clock in signal
 * handlers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char shift_path[4096];
static volatile long long shift_seconds;
static volatile long long shift_read_at_ns;
static int	(*real_clock_gettime) (clockid_t, struct timespec *);

__attribute__((constructor))
static void
clock_shift_init(void)
{
	const char *path = getenv("CLOCK_SHIFT_FILE");

	if (path != NULL && strlen(path) < sizeof(shift_path))
		strcpy(shift_path, path);
	real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
}

static long long
clock_shift(void)
{
	struct timespec mono;
	long long	now_ns;

	if (shift_path[0] == '\0' || real_clock_gettime == NULL)
		return 0;
	real_clock_gettime(CLOCK_MONOTONIC, &mono);
	now_ns = mono.tv_sec * 1000000000LL + mono.tv_nsec;
	if (shift_read_at_ns == 0 || now_ns - shift_read_at_ns > 20000000LL)
	{
		char		buf[32];
		int			saved_errno = errno;
		int			fd = open(shift_path, O_RDONLY | O_CLOEXEC);

		if (fd >= 0)
		{
			ssize_t		n = read(fd, buf, sizeof(buf) - 1);

			close(fd);
			if (n > 0)
			{
				buf[n] = '\0';
				shift_seconds = strtoll(buf, NULL, 10);
			}
		}
		shift_read_at_ns = now_ns;
		errno = saved_errno;
	}
	return shift_seconds;
}

int
clock_gettime(clockid_t clock, struct timespec *ts)
{
	int			rc;

	if (real_clock_gettime == NULL)
		real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
	rc = real_clock_gettime(clock, ts);
	if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
		ts->tv_sec += clock_shift();
	return rc;
}

int
gettimeofday(struct timeval *tv, void *tz)
{
	struct timespec ts;

	(void) tz;
	if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return -1;
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

time_t
time(time_t *out)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	if (out != NULL)
		*out = ts.tv_sec;
	return ts.tv_sec;
}
