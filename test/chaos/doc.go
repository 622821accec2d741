// Package chaos holds an opt-in chaos test of the built changegate binary
// (issue 19): a journaling writer on test/mongowire behind a TCP proxy that
// cuts connections, changegate killed with SIGKILL and restarted, and two
// webhook receivers (a default sink and a parking sink) that answer 503 with
// Retry-After and then refuse connections for a while. A verifier checks
// every document's delivered change sequence against the journal.
//
// Everything is in the package's tests; run them with
//
//	CHANGEGATE_CHAOS=1 go test ./test/chaos -run Chaos -v -timeout 30m
//
// CHANGEGATE_CHAOS_RUNS=N runs N campaigns (default 1), and
// CHANGEGATE_CHAOS_SEED=S fixes the random schedule of the first one (run i
// uses S+i); each run prints its seed so that a failure can be replayed.
// CHANGEGATE_CHAOS_DIR keeps each run's config and changegate log there
// (default: a temporary directory, removed after the test).
//
// TestClusterChaos is the cluster campaign of issue 25 (three replicas,
// partitions = 6, lease_ttl = "5s", a cuttable proxy per replica, receiver
// outages, a parking sink, kill -9 / SIGSTOP / SIGTERM of replicas), opt-in
// with CHANGEGATE_CHAOS_CLUSTER=1 and the same RUNS, SEED and DIR variables;
// it also counts stale sends (a request from a replica after its own lease
// loss or release line) and fails on those after a release or more than 1 s
// after a loss. CHANGEGATE_CHAOS_BIN runs any campaign against a
// given binary. docs/testing.md describes both campaigns.
//
// TestChaosSmoke, a small campaign without receiver outages (about 10 s), and
// TestClusterChaosShort, a short cluster campaign (about 50 s; a request
// after a release, or more than 1 s after a lease loss, fails it), run in
// the default suite unless -short.
package chaos
