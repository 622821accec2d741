package metrics_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/changegate/changegate/metrics"
)

// family is a documented metric: its name, type and label names.
type family struct {
	name   string
	typ    dto.MetricType
	labels []string
	touch  func(m *metrics.Metrics) // creates one series, so it is exported
}

var (
	counter   = dto.MetricType_COUNTER
	gauge     = dto.MetricType_GAUGE
	histogram = dto.MetricType_HISTOGRAM
)

// families lists every changegate collector as documented on Metrics and
// used by the dashboards in deploy/.
var families = []family{
	{"changegate_events_read_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.EventsRead.WithLabelValues("s").Inc() }},
	{"changegate_events_matched_total", counter, []string{"rule", "source"}, func(m *metrics.Metrics) { m.EventsMatched.WithLabelValues("s", "r").Inc() }},
	{"changegate_events_unmatched_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.EventsUnmatched.WithLabelValues("s").Inc() }},
	{"changegate_deliveries_total", counter, []string{"outcome", "sink"}, func(m *metrics.Metrics) {
		m.Deliveries.WithLabelValues("k", metrics.OutcomeDelivered).Inc()
	}},
	{"changegate_delivery_attempts_total", counter, []string{"sink"}, func(m *metrics.Metrics) { m.Attempts.WithLabelValues("k").Inc() }},
	{"changegate_delivery_failures_total", counter, []string{"reason", "sink"}, func(m *metrics.Metrics) {
		m.DeliveryFailures.WithLabelValues("k", "http_503").Inc()
	}},
	{"changegate_delivery_duration_seconds", histogram, []string{"sink"}, func(m *metrics.Metrics) { m.DeliveryDuration.WithLabelValues("k").Observe(0.01) }},
	{"changegate_end_to_end_lag_seconds", histogram, []string{"sink"}, func(m *metrics.Metrics) { m.EndToEndLag.WithLabelValues("k").Observe(0.5) }},
	{"changegate_events_in_flight", gauge, []string{"source"}, func(m *metrics.Metrics) { m.InFlight.WithLabelValues("s").Inc() }},
	{"changegate_sink_queue_depth", gauge, []string{"sink"}, func(m *metrics.Metrics) { m.QueueDepth.WithLabelValues("k").Set(3) }},
	{"changegate_sink_parked", gauge, []string{"sink"}, func(m *metrics.Metrics) { m.SinkParked.WithLabelValues("k").Set(1) }},
	{"changegate_sink_concurrency_limit", gauge, []string{"sink"}, func(m *metrics.Metrics) { m.SinkConcurrency.WithLabelValues("k").Set(64) }},
	{"changegate_stream_reconnects_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.StreamReconnects.WithLabelValues("s").Inc() }},
	{"changegate_stream_invalidates_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.StreamInvalidates.WithLabelValues("s").Inc() }},
	{"changegate_history_lost_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.HistoryLost.WithLabelValues("s").Inc() }},
	{"changegate_split_events_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.SplitEvents.WithLabelValues("s").Inc() }},
	{"changegate_oversize_events_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.OversizeEvents.WithLabelValues("s").Inc() }},
	{"changegate_transactions_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.Transactions.WithLabelValues("s").Inc() }},
	{"changegate_transaction_events", histogram, []string{"source"}, func(m *metrics.Metrics) { m.TransactionEvents.WithLabelValues("s").Observe(3) }},
	{"changegate_transaction_groups_total", counter, []string{"sink"}, func(m *metrics.Metrics) { m.TxnGroups.WithLabelValues("k").Inc() }},
	{"changegate_transaction_group_events", histogram, []string{"sink"}, func(m *metrics.Metrics) { m.TxnGroupEvents.WithLabelValues("k").Observe(3) }},
	{"changegate_sink_oversize_events_total", counter, []string{"action", "sink"}, func(m *metrics.Metrics) {
		m.SinkOversize.WithLabelValues("k", metrics.OversizeStrip).Inc()
	}},
	{"changegate_stream_consecutive_failures", gauge, []string{"source"}, func(m *metrics.Metrics) { m.StreamFailures.WithLabelValues("s").Set(3) }},
	{"changegate_checkpoint_saves_total", counter, []string{"source"}, func(m *metrics.Metrics) { m.CheckpointSaves.WithLabelValues("s").Inc() }},
	{"changegate_checkpoint_lag_seconds", gauge, []string{"source"}, func(m *metrics.Metrics) { m.CheckpointLag.WithLabelValues("s").Set(2) }},
	{"changegate_deadletters", gauge, []string{"kind", "sink"}, func(m *metrics.Metrics) { m.DeadLetters.WithLabelValues("k", "failed").Set(1) }},
	{"changegate_lease_owned", gauge, []string{"unit"}, func(m *metrics.Metrics) { m.LeaseOwned.WithLabelValues("s#0/2").Set(1) }},
	{"changegate_lease_acquisitions_total", counter, []string{"unit"}, func(m *metrics.Metrics) { m.LeaseAcquisitions.WithLabelValues("s").Inc() }},
	{"changegate_lease_losses_total", counter, []string{"unit"}, func(m *metrics.Metrics) { m.LeaseLosses.WithLabelValues("s").Inc() }},
	{"changegate_cluster_members", gauge, nil, func(m *metrics.Metrics) { m.ClusterMembers.Set(2) }},
	{"changegate_cluster_member_info", gauge, []string{"member"}, func(m *metrics.Metrics) { m.ClusterMember.WithLabelValues("pod-a").Set(1) }},
	{"changegate_inflight_bytes", gauge, nil, func(m *metrics.Metrics) { m.InflightBytes.Set(1 << 20) }},
	{"changegate_inflight_bytes_budget", gauge, nil, func(m *metrics.Metrics) { m.InflightBytesBudget.Set(256 << 20) }},
}

func gather(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// TestCollectorsOnTheGivenRegistry: New registers every collector, with its
// documented name, type and labels, on the registry it is given, plus the Go
// runtime and process collectors; and nothing else named changegate_*.
func TestCollectorsOnTheGivenRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	for _, f := range families {
		f.touch(m)
	}
	got := gather(t, reg)
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			mf := got[f.name]
			if mf == nil {
				t.Fatalf("%s not registered", f.name)
			}
			if mf.GetType() != f.typ || mf.GetHelp() == "" {
				t.Fatalf("%s: type %v, help %q; want %v with a help text", f.name, mf.GetType(), mf.GetHelp(), f.typ)
			}
			if len(mf.GetMetric()) != 1 {
				t.Fatalf("%s: %d series, want 1", f.name, len(mf.GetMetric()))
			}
			var labels []string
			for _, l := range mf.GetMetric()[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
			if !slices.Equal(labels, f.labels) {
				t.Fatalf("%s labels %v, want %v", f.name, labels, f.labels)
			}
		})
	}
	var extra []string
	for name := range got {
		if strings.HasPrefix(name, "changegate_") && !slices.ContainsFunc(families, func(f family) bool { return f.name == name }) {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		t.Errorf("undocumented collectors %v: add them to this table and to the dashboards", extra)
	}
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if got[name] == nil {
			t.Errorf("%s not registered: the runtime and process collectors belong on the same registry", name)
		}
	}
}

// TestNoGlobalRegistry: New touches only the registry it is given (none for
// nil), so two gateways in one process (or two tests) do not collide.
func TestNoGlobalRegistry(t *testing.T) {
	a, b := prometheus.NewRegistry(), prometheus.NewRegistry()
	ma, mb := metrics.New(a), metrics.New(b)
	mn := metrics.New(nil)
	ma.EventsRead.WithLabelValues("s").Add(2)
	mb.EventsRead.WithLabelValues("s").Add(5)
	mn.EventsRead.WithLabelValues("s").Inc() // usable without a registry
	const name = "changegate_events_read_total"
	va := gather(t, a)[name].GetMetric()[0].GetCounter().GetValue()
	vb := gather(t, b)[name].GetMetric()[0].GetCounter().GetValue()
	if va != 2 || vb != 5 {
		t.Fatalf("%s = %v and %v, want 2 and 5: the registries share state", name, va, vb)
	}
	for name := range gather(t, prometheus.DefaultGatherer) {
		if strings.HasPrefix(name, "changegate_") {
			t.Fatalf("%s is on the global registry", name)
		}
	}
}

// TestNewTwiceOnOneRegistry: New has no error result; registering a second
// set of collectors on a registry that already holds them panics with the
// registry's AlreadyRegisteredError (MustRegister). A caller that runs
// app.Run twice must give each run its own registry.
func TestNewTwiceOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	metrics.New(reg)
	defer func() {
		r := recover()
		err, _ := r.(error)
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			t.Fatalf("second New on one registry: recovered %v, want an AlreadyRegisteredError panic", r)
		}
	}()
	metrics.New(reg)
}
