// Package metrics defines changegate's Prometheus collectors. Every
// component receives the *Metrics it reports to; nothing registers on the
// global registry.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Delivery outcomes used as the "outcome" label of DeliveriesTotal.
const (
	OutcomeDelivered     = "delivered"
	OutcomeRetried       = "retried"
	OutcomeDeadLettered  = "dead_lettered"
	OutcomeParked        = "parked"
	OutcomeRedriven      = "redriven"
	OutcomeDroppedOversz = "dropped_oversize"
	// OutcomeDroppedLeaseLost counts events dropped because this replica
	// lost the lease of their unit: the next owner re-reads them.
	OutcomeDroppedLeaseLost = "dropped_lease_lost"
	// OutcomeSkippedEmpty counts updates not sent to a sink because its
	// shaped changes were empty (skip_empty_updates); they are
	// acknowledged like delivered ones.
	OutcomeSkippedEmpty = "skipped_empty"
)

// Actions used as the "action" label of SinkOversize.
const (
	OversizeStrip      = "strip"
	OversizeDeadLetter = "deadletter"
)

// Metrics holds every collector. The zero value is not usable; use New.
type Metrics struct {
	EventsRead        *prometheus.CounterVec   // source
	EventsMatched     *prometheus.CounterVec   // source, rule
	EventsUnmatched   *prometheus.CounterVec   // source
	Deliveries        *prometheus.CounterVec   // sink, outcome
	Attempts          *prometheus.CounterVec   // sink
	DeliveryFailures  *prometheus.CounterVec   // sink, reason: failed attempts per event
	DeliveryDuration  *prometheus.HistogramVec // sink: one request, seconds
	EndToEndLag       *prometheus.HistogramVec // sink: now - change wall time at delivery
	InFlight          *prometheus.GaugeVec     // source
	QueueDepth        *prometheus.GaugeVec     // sink
	SinkParked        *prometheus.GaugeVec     // sink: 1 while the sink's backlog is parked
	SinkConcurrency   *prometheus.GaugeVec     // sink: current concurrency limit of its requests
	StreamReconnects  *prometheus.CounterVec   // source
	StreamInvalidates *prometheus.CounterVec   // source
	HistoryLost       *prometheus.CounterVec   // source
	SplitEvents       *prometheus.CounterVec   // source: events reassembled from fragments
	OversizeEvents    *prometheus.CounterVec   // source: changes MongoDB could not return (10334)
	Transactions      *prometheus.CounterVec   // source: multi-document transactions read (their last event handed on)
	TransactionEvents *prometheus.HistogramVec // source: events per transaction read
	TxnGroups         *prometheus.CounterVec   // sink: transactions queued as one group (transactions = "group")
	TxnGroupEvents    *prometheus.HistogramVec // sink: events per transaction group
	StreamFailures    *prometheus.GaugeVec     // source: consecutive stream failures without progress
	SinkOversize      *prometheus.CounterVec   // sink, action: events over the sink's payload limit, stripped or dead-lettered
	CheckpointSaves   *prometheus.CounterVec   // source
	CheckpointLag     *prometheus.GaugeVec     // source: seconds between newest change seen and checkpoint
	DeadLetters       *prometheus.GaugeVec     // sink, kind: entries in the dead-letter collection
	LeaseOwned        *prometheus.GaugeVec     // unit: 1 while this replica holds the unit's lease (cluster mode)
	LeaseAcquisitions *prometheus.CounterVec   // unit: leases acquired by this replica
	LeaseLosses       *prometheus.CounterVec   // unit: leases lost (not renewed in time, refused, fenced)
	ClusterMembers    prometheus.Gauge         // live members seen in the last round
	ClusterMember     *prometheus.GaugeVec     // member: 1, names this replica (its [cluster] instance)

	SnapshotDocuments *prometheus.CounterVec // source: documents read by initial snapshots
	SnapshotEstimated *prometheus.GaugeVec   // source: estimated documents of the running snapshot
	SnapshotRunning   *prometheus.GaugeVec   // source: 1 while an initial snapshot scans
	BackfillDocuments *prometheus.CounterVec // source, sink: documents sent by backfills ("" sink: every matching sink)

	InflightBytes       prometheus.Gauge // bytes of events held, against max_in_flight_bytes
	InflightBytesBudget prometheus.Gauge // max_in_flight_bytes in force
}

// New creates the collectors and registers them, with the Go runtime and
// process collectors, on reg (which may be nil for tests that do not scrape).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		EventsRead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_events_read_total", Help: "Change events read from the source's change stream.",
		}, []string{"source"}),
		EventsMatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_events_matched_total", Help: "Change events matched, by rule.",
		}, []string{"source", "rule"}),
		EventsUnmatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_events_unmatched_total", Help: "Change events that matched no rule and were acknowledged at once.",
		}, []string{"source"}),
		Deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_deliveries_total", Help: "Event deliveries to sinks, by outcome (delivered, retried, dead_lettered, parked, redriven, dropped_oversize, skipped_empty).",
		}, []string{"sink", "outcome"}),
		DeliveryFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_delivery_failures_total", Help: "Failed delivery attempts per event, by sink and reason (http_503, throttled, transport, oversize, ...).",
		}, []string{"sink", "reason"}),
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_delivery_attempts_total", Help: "Requests made to sinks (a batch counts once).",
		}, []string{"sink"}),
		DeliveryDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "changegate_delivery_duration_seconds", Help: "Duration of one delivery request to a sink.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"sink"}),
		EndToEndLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "changegate_end_to_end_lag_seconds", Help: "Time from the change in MongoDB (wall time) to its successful delivery.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20),
		}, []string{"sink"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_events_in_flight", Help: "Events read but not yet acknowledged by every sink.",
		}, []string{"source"}),
		QueueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_sink_queue_depth", Help: "Events queued in memory for a sink.",
		}, []string{"sink"}),
		SinkParked: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_sink_parked", Help: "1 while the sink's backlog is parked in MongoDB for a later ordered re-drive.",
		}, []string{"sink"}),
		SinkConcurrency: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_sink_concurrency_limit", Help: "Current limit of concurrent requests to a sink (adaptive with max_in_flight = \"auto\", else fixed).",
		}, []string{"sink"}),
		StreamReconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_stream_reconnects_total", Help: "Change streams reopened after an error.",
		}, []string{"source"}),
		StreamInvalidates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_stream_invalidates_total", Help: "Invalidate events (drop, rename) seen.",
		}, []string{"source"}),
		HistoryLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_history_lost_total", Help: "Times a source's resume point had fallen off the oplog (ChangeStreamHistoryLost).",
		}, []string{"source"}),
		SplitEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_split_events_total", Help: "Change events over 16 MB reassembled from $changeStreamSplitLargeEvent fragments.",
		}, []string{"source"}),
		OversizeEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_oversize_events_total", Help: "Change events MongoDB could not return (BSONObjectTooLarge) and the source skipped or stopped at.",
		}, []string{"source"}),
		Transactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_transactions_total", Help: "Multi-document transactions read by a source (counted when their last event is handed on; a transaction read again after a restart counts again).",
		}, []string{"source"}),
		TransactionEvents: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "changegate_transaction_events", Help: "Events per multi-document transaction read by a source (those of its changes the source reads).",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 500, 1000, 10000},
		}, []string{"source"}),
		TxnGroups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_transaction_groups_total", Help: "Transactions queued as one group for a sink with transactions = \"group\" (a transaction read again after a restart counts again).",
		}, []string{"sink"}),
		TxnGroupEvents: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "changegate_transaction_group_events", Help: "Events per transaction group of a sink with transactions = \"group\" (those of the transaction's events routed to the sink).",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 500, 1000, 10000},
		}, []string{"sink"}),
		StreamFailures: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_stream_consecutive_failures", Help: "Change stream failures since the stream last made progress; 0 while it reads.",
		}, []string{"source"}),
		SinkOversize: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_sink_oversize_events_total", Help: "Events whose payload exceeded the sink's limit (max_request_bytes), by action: strip (delivered stripped, oversize = \"strip\") or deadletter (dead-lettered with reason oversize).",
		}, []string{"sink", "action"}),
		CheckpointSaves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_checkpoint_saves_total", Help: "Checkpoints persisted.",
		}, []string{"source"}),
		CheckpointLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_checkpoint_lag_seconds", Help: "Seconds between the newest change seen and the persisted checkpoint.",
		}, []string{"source"}),
		DeadLetters: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_deadletters", Help: "Entries in the dead-letter collection by sink and kind (failed, parked, gap); refreshed periodically.",
		}, []string{"sink", "kind"}),
		LeaseOwned: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_lease_owned", Help: "1 while this replica holds the lease of the unit of work (cluster mode), else 0.",
		}, []string{"unit"}),
		LeaseAcquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_lease_acquisitions_total", Help: "Leases of units of work acquired by this replica.",
		}, []string{"unit"}),
		LeaseLosses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_lease_losses_total", Help: "Leases lost by this replica (not renewed before the deadline, renewal refused, or a checkpoint save fenced by a newer owner).",
		}, []string{"unit"}),
		ClusterMembers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "changegate_cluster_members", Help: "Live changegate replicas seen by this one in cluster mode (itself included).",
		}),
		ClusterMember: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "changegate_cluster_member_info", Help: "Always 1; the member label is this replica's [cluster] instance name.",
		}, []string{"member"}),
	}
	m.SnapshotDocuments = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "changegate_snapshot_documents_total", Help: "Documents read by a source's initial snapshot (snapshot = \"initial\") and handed to the router.",
	}, []string{"source"})
	m.SnapshotEstimated = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "changegate_snapshot_documents_estimated", Help: "Estimated number of documents the running initial snapshot scans (estimatedDocumentCount of its collections).",
	}, []string{"source"})
	m.SnapshotRunning = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "changegate_snapshot_running", Help: "1 while the source's initial snapshot scans its collections, else 0.",
	}, []string{"source"})
	m.BackfillDocuments = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "changegate_backfill_documents_total", Help: "Documents sent by on-demand backfills, by source and target sink (empty: every matching sink).",
	}, []string{"source", "sink"})
	if reg != nil {
		reg.MustRegister(m.SnapshotDocuments, m.SnapshotEstimated, m.SnapshotRunning, m.BackfillDocuments)
	}
	m.InflightBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "changegate_inflight_bytes", Help: "Bytes of change events the process holds (raw changes, shaped views, encodings, request bodies, entries read for re-drives and replays), counted against max_in_flight_bytes.",
	})
	m.InflightBytesBudget = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "changegate_inflight_bytes_budget", Help: "The byte budget in force (max_in_flight_bytes, or its default from the container's memory limit); sources stop reading while changegate_inflight_bytes would exceed it.",
	})
	if reg != nil {
		reg.MustRegister(m.InflightBytes, m.InflightBytesBudget)
	}
	if reg != nil {
		reg.MustRegister(m.EventsRead, m.EventsMatched, m.EventsUnmatched, m.Deliveries, m.Attempts, m.DeliveryFailures,
			m.DeliveryDuration, m.EndToEndLag, m.InFlight, m.QueueDepth, m.SinkParked, m.SinkConcurrency,
			m.StreamReconnects, m.StreamInvalidates, m.HistoryLost, m.SplitEvents, m.OversizeEvents, m.Transactions, m.TransactionEvents, m.TxnGroups, m.TxnGroupEvents, m.StreamFailures, m.SinkOversize, m.CheckpointSaves, m.CheckpointLag, m.DeadLetters,
			m.LeaseOwned, m.LeaseAcquisitions, m.LeaseLosses, m.ClusterMembers, m.ClusterMember,
			collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}
