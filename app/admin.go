package app

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/changegate/changegate/source"
)

// statusReport is the body of /readyz and /api/v1/status.
type statusReport struct {
	Ready   bool           `json:"ready"`
	Sources []sourceReport `json:"sources"`
	Sinks   []sinkReport   `json:"sinks"`
}

type sourceReport struct {
	Name             string    `json:"name"`
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
}

type sinkReport struct {
	Name        string    `json:"name"`
	Ready       bool      `json:"ready"`
	Reason      string    `json:"reason,omitempty"`
	Queued      int64     `json:"queueDepth"`
	InProgress  int64     `json:"inProgress"`
	Parked      bool      `json:"parked"`
	Failing     bool      `json:"failing"`
	LastError   string    `json:"lastError,omitempty"`
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
}

func (g *gateway) report() statusReport {
	r := statusReport{Ready: true}
	for _, s := range g.sources {
		st := s.Status()
		sr := sourceReport{
			Name: st.Name, State: string(st.State), LastError: st.LastError, InFlight: st.InFlight,
			CheckpointTime: st.Checkpoint.WallTime, CheckpointSaved: st.CheckpointSave,
			CheckpointCT: st.Checkpoint.ClusterTime.T, LastEvent: st.LastEvent,
		}
		if st.Checkpoint.Token != nil {
			sr.CheckpointToken = st.Checkpoint.Token.String()
		}
		if !st.LastEvent.IsZero() && !st.Checkpoint.WallTime.IsZero() {
			sr.CheckpointLagSec = st.LastEvent.Sub(st.Checkpoint.WallTime).Seconds()
		}
		switch {
		case st.State != source.StateOpen:
			sr.Reason = "change stream is " + string(st.State)
		case st.InFlight > 0 && !st.CheckpointSave.IsZero() && time.Since(st.CheckpointSave) > g.staleAfter:
			sr.Reason = "checkpoint has not advanced for " + time.Since(st.CheckpointSave).Round(time.Second).String()
		}
		sr.Ready = sr.Reason == ""
		r.Ready = r.Ready && sr.Ready
		r.Sources = append(r.Sources, sr)
	}
	for _, l := range g.engine.Lanes() {
		st := l.Status()
		kr := sinkReport{
			Name: st.Name, Queued: st.Queued, InProgress: st.InProgress, Parked: st.Parked,
			Failing: st.Failing, LastError: st.LastError, LastSuccess: st.LastSuccess,
		}
		// A parked sink does not hold the sources back, but it is not
		// delivering: report it so an operator sees it.
		if st.Failing && st.Queued+st.InProgress > 0 && time.Since(st.LastSuccess) > g.staleAfter {
			kr.Reason = "sink has not delivered for " + time.Since(st.LastSuccess).Round(time.Second).String() + ": " + st.LastError
		}
		kr.Ready = kr.Reason == ""
		r.Ready = r.Ready && kr.Ready
		r.Sinks = append(r.Sinks, kr)
	}
	return r
}

func (g *gateway) handler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		r := g.report()
		code := http.StatusOK
		if !r.Ready {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, r)
	})
	mux.HandleFunc("GET /api/v1/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, g.report())
	})
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
