package api

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// statusRoutes registers the probes, /metrics (reg) and /api/v1/status.
func (s *Server) statusRoutes(rs *Routes, reg *prometheus.Registry) {
	if reg != nil {
		rs.Handle("GET /metrics", Open, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}).ServeHTTP)
	}
	rs.Handle("GET /healthz", Open, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	rs.Handle("GET /readyz", Open, func(w http.ResponseWriter, r *http.Request) {
		st := s.gw.Status()
		code := http.StatusOK
		if !st.Ready {
			code = http.StatusServiceUnavailable
		}
		if !mayRead(s.gw.Config(), PrincipalOf(r)) {
			// The verdict is open (probes); the details are data.
			WriteJSON(w, code, st.verdict())
			return
		}
		WriteJSON(w, code, st)
	})
	rs.Handle("GET /api/v1/status", Read, func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, s.gw.Status())
	})
}

// Status is the body of /readyz and /api/v1/status.
type Status struct {
	Ready bool `json:"ready"`
	// Instance names this replica ([cluster] instance).
	Instance string `json:"instance"`
	// Cluster is true in cluster mode; Members lists the live replicas
	// then, and Reason says why the lease loop is not healthy.
	Cluster bool     `json:"cluster"`
	Members []string `json:"members,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	// Units lists every unit of work (a source, or a partition of one):
	// its lease and whether this replica is active or standby for it.
	// Sources lists the units running here.
	Units   []UnitStatus   `json:"units"`
	Sources []SourceStatus `json:"sources"`
	Sinks   []SinkStatus   `json:"sinks"`
	// Memory is the byte budget (max_in_flight_bytes) and what it holds.
	Memory MemoryStatus `json:"memory"`
}

// MemoryStatus is the byte budget in /api/v1/status.
type MemoryStatus struct {
	// InflightBytes are the bytes of events held now; BudgetBytes the
	// budget, BudgetFrom where it comes from.
	InflightBytes int64  `json:"inflightBytes"`
	BudgetBytes   int64  `json:"budgetBytes"`
	BudgetFrom    string `json:"budgetFrom"`
	// ContainerLimitBytes is the container's memory limit (0: none);
	// GoMemLimitBytes the Go runtime's soft limit in force (0: none).
	ContainerLimitBytes int64  `json:"containerLimitBytes,omitempty"`
	GoMemLimitBytes     int64  `json:"goMemLimitBytes,omitempty"`
	GoMemLimitFrom      string `json:"goMemLimitFrom"`
	// HeldBackSince is set while a reader waits for the budget: reading
	// is held back since then.
	HeldBackSince time.Time `json:"heldBackSince,omitzero"`
}

// UnitStatus is one unit of work in /api/v1/status.
type UnitStatus struct {
	Name    string    `json:"name"`
	Source  string    `json:"source"`
	Owner   string    `json:"owner,omitempty"`
	Epoch   int64     `json:"epoch,omitempty"`
	Expires time.Time `json:"leaseExpires,omitzero"`
	// Role is "active" when this replica runs the unit, else "standby".
	Role string `json:"role"`
}

// SourceStatus is a unit running here, and its source, in /api/v1/status.
type SourceStatus struct {
	Name             string    `json:"name"` // the unit's name
	Source           string    `json:"source"`
	State            string    `json:"state"`
	Ready            bool      `json:"ready"`
	Reason           string    `json:"reason,omitempty"`
	LastError        string    `json:"lastError,omitempty"`
	InFlight         int       `json:"inFlight"`
	CheckpointTime   time.Time `json:"checkpointTime,omitzero"`
	CheckpointSaved  time.Time `json:"checkpointSavedAt,omitzero"`
	CheckpointCT     uint32    `json:"checkpointClusterTime,omitempty"`
	CheckpointToken  string    `json:"checkpointToken,omitempty"`
	LastEvent        time.Time `json:"lastEventTime,omitzero"`
	CheckpointLagSec float64   `json:"checkpointLagSeconds"`
	// Snapshot is the progress of the unit's initial snapshot
	// (snapshot = "initial"), when one ran in this process.
	Snapshot *SnapshotStatus `json:"snapshot,omitempty"`
	// Brief is Reason without the error text, for the open /readyz.
	Brief string `json:"-"`
}

// SnapshotStatus is the progress of an initial snapshot in /api/v1/status.
type SnapshotStatus struct {
	ID        string `json:"id"`
	State     string `json:"state"` // scanning, draining, done
	Namespace string `json:"namespace,omitempty"`
	// Scanned documents read (earlier runs of the same snapshot included),
	// Acked those covered by the saved progress, Estimated the collections'
	// estimatedDocumentCount.
	Scanned    int64   `json:"scanned"`
	Acked      int64   `json:"acked"`
	Estimated  int64   `json:"estimated"`
	Percent    float64 `json:"percent"`
	Rate       float64 `json:"docsPerSecond"`
	ETASeconds float64 `json:"etaSeconds"`
}

// SinkStatus is a sink in /api/v1/status.
type SinkStatus struct {
	Name        string    `json:"name"`
	Ready       bool      `json:"ready"`
	Reason      string    `json:"reason,omitempty"`
	Queued      int64     `json:"queueDepth"`
	InProgress  int64     `json:"inProgress"`
	Parked      bool      `json:"parked"`
	Failing     bool      `json:"failing"`
	LastError   string    `json:"lastError,omitempty"`
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	// PausedUntil is set while the receiver's Retry-After holds the sink's
	// requests back.
	PausedUntil time.Time `json:"pausedUntil,omitzero"`
	// ConcurrencyLimit is the current limit of concurrent requests (adaptive
	// with max_in_flight = "auto"), Requests those in flight, LatencyMs the
	// smoothed latency of successful requests, and Circuit the breaker's
	// state (closed, open, half-open).
	Adaptive         bool    `json:"adaptive"`
	ConcurrencyLimit int     `json:"concurrencyLimit"`
	Requests         int     `json:"requestsInFlight"`
	LatencyMs        float64 `json:"latencyMs"`
	Circuit          string  `json:"circuit,omitempty"`
	// Brief is Reason without the error text, for the open /readyz.
	Brief string `json:"-"`
}

// verdict is r without details: which sources and sinks are ready and
// why not, without error texts, positions or counts. /readyz shows it to callers that may not
// read data.
func (r Status) verdict() Status {
	out := Status{Ready: r.Ready}
	for _, s := range r.Sources {
		out.Sources = append(out.Sources, SourceStatus{Name: s.Name, State: s.State, Ready: s.Ready, Reason: s.Brief})
	}
	for _, s := range r.Sinks {
		out.Sinks = append(out.Sinks, SinkStatus{Name: s.Name, Ready: s.Ready, Reason: s.Brief})
	}
	return out
}
