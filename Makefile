# outbox_pg — PGXS build
#
#   make && make install        build and install the extension
#   make installcheck           pg_regress, isolation specs and TAP tests on a
#                               private temporary instance (run as a non-root
#                               user; test/run does all of it from scratch)
#   make bench                  benchmarks (see README.md, "Performance")
#
# Sources are under src/ (see README.md, "Source layout"); tests under test/
# (sql/ and expected/ for pg_regress, specs/ for isolation, t/ for TAP);
# sql/ holds only the install and upgrade scripts.

MODULE_big = outbox_pg
# Every .c under src/ is part of the module: src/ holds what all subsystems
# share, src/api/ what runs in application backends, src/worker/ the
# launcher and relays, src/destination/ the kinds and their transport.
OBJS = $(patsubst $(srcdir)/%.c,%.o,$(sort $(wildcard $(srcdir)/src/*.c $(srcdir)/src/*/*.c)))

EXTENSION = outbox_pg
# relative to the source directory, which a VPATH build (pg_buildext,
# debian/rules) is not in
DATA = $(patsubst $(srcdir)/%,%,$(wildcard $(srcdir)/sql/outbox_pg--*.sql))
PGFILEDESC = "outbox_pg - transactional outbox with an in-server relay"

SHLIB_LINK += $(shell curl-config --libs) -lrdkafka -lrabbitmq
PG_CPPFLAGS += -I$(srcdir)/src $(shell curl-config --cflags)
PG_CFLAGS += -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers -Wno-sign-compare

REGRESS = setup emit emit_errors routes inbox privileges retry order_retention \
	ops_monitoring inbox_messages ha_columns brokers_config destination_options kafka_options classify circuit \
	config_secrets search_path peer_text egress store_claim store_retries store_rotation store_surface \
	destination_lifecycle roles
REGRESS_OPTS = --inputdir=$(srcdir)/test --temp-instance=./tmp_check --temp-config=$(srcdir)/test/regress.conf
ISOLATION = claim_concurrent lease_skip_locked lease_fence order_lease order_gap \
	inbox_receive_concurrent store_claim_gap store_rotation_lock \
	store_spill_ack
ISOLATION_OPTS = --inputdir=$(srcdir)/test --temp-instance=./tmp_check_iso --temp-config=$(srcdir)/test/regress.conf
TAP_TESTS = 1
PROVE_TESTS = $(wildcard $(srcdir)/test/t/*.pl)

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies (Debian's build has no autodepend):
# every object is rebuilt when any of our headers changes, so a tree built
# before a pull never links objects that disagree on a shared struct.
$(OBJS): $(wildcard $(srcdir)/src/*.h $(srcdir)/src/*/*.h)

# A VPATH build (pg_buildext, as debian/rules runs it, in a directory per
# major) writes each object and bitcode file under its own directory's
# src/: those directories are made first (in the source tree they exist).
# Absolute names, or make would find the source tree's through VPATH.
OBJDIRS := $(patsubst %/,%,$(addprefix $(CURDIR)/,$(sort $(dir $(OBJS)))))
$(OBJS) $(OBJS:.o=.bc): | $(OBJDIRS)
$(OBJDIRS):
	$(MKDIR_P) $@

.PHONY: bench
bench:
	$(srcdir)/test/bench/run

# The three suites one by one, so that a failure in one does not hide the
# others (test/run calls these and counts the results).
.PHONY: check-regress check-isolation check-tap
check-regress: submake $(REGRESS_PREP)
	$(pg_regress_installcheck) $(REGRESS_OPTS) $(REGRESS)
check-isolation: submake
	$(pg_isolation_regress_installcheck) $(ISOLATION_OPTS) $(ISOLATION)
check-tap:
	$(prove_installcheck)

# The regression suite and one relay TAP test with every server process
# under valgrind's memcheck; reports what passes through outbox_pg (see
# README, "Memory checking").  Slow: not part of test/run.
.PHONY: valgrind
valgrind:
	$(srcdir)/test/valgrind/run $(bindir) $(VALGRIND_TAP_TESTS)
