package app

import (
	"math"
	"runtime/debug"
	"time"

	"github.com/changegate/changegate/api"
	"github.com/changegate/changegate/source"
)

// memoryReport is the byte budget and what it holds now.
func (g *gateway) memoryReport() api.MemoryStatus {
	r := api.MemoryStatus{
		InflightBytes: g.budget.InUse(), BudgetBytes: g.budget.Limit(), BudgetFrom: g.sizing.BudgetFrom,
		ContainerLimitBytes: g.sizing.Container.Limit, GoMemLimitFrom: g.sizing.GoMemLimitFrom,
		HeldBackSince: g.budget.Waiting(),
	}
	if l := debug.SetMemoryLimit(-1); l < math.MaxInt64 {
		r.GoMemLimitBytes = l
	}
	return r
}

// snapshotStatus is sn in the status report (nil: no snapshot ran here).
func snapshotStatus(sn *source.SnapshotStatus) *api.SnapshotStatus {
	if sn == nil {
		return nil
	}
	r := &api.SnapshotStatus{ID: sn.ID, State: sn.State, Namespace: sn.Namespace, Scanned: sn.Scanned, Acked: sn.Acked,
		Estimated: sn.Estimated, Rate: sn.Rate, ETASeconds: sn.ETA.Seconds()}
	switch {
	case sn.State == "done":
		r.Percent = 100
	case sn.Estimated > 0:
		r.Percent = min(100, float64(sn.Scanned)*100/float64(sn.Estimated))
	}
	return r
}

// Status reports every unit, source and sink, and whether the gateway is
// ready (api.Gateway).
func (g *gateway) Status() api.Status {
	r := api.Status{Ready: true, Instance: g.instance, Sources: []api.SourceStatus{}, Memory: g.memoryReport()}
	if g.cl != nil {
		var healthy bool
		r.Cluster = true
		r.Units, healthy, r.Members = g.cl.status()
		if !healthy {
			// A standby is ready (it can take over); one that cannot
			// reach the leases collection is not.
			r.Ready = false
			r.Reason = "no membership heartbeat within the lease ttl: the leases collection cannot be reached"
		}
	} else {
		for _, d := range g.defs {
			r.Units = append(r.Units, api.UnitStatus{Name: d.name, Source: d.source, Role: "active"})
		}
	}
	// server.ready_max_lag: a checkpoint or sink this long without progress
	// is not ready. Read per report, so a reload applies it.
	staleAfter := g.Config().Server.ReadyMaxLag
	for _, u := range g.units.snapshot() {
		s := u.src
		st := s.Status()
		sr := api.SourceStatus{
			Name: st.Name, Source: st.Source, State: string(st.State), LastError: st.LastError, InFlight: st.InFlight,
			CheckpointTime: st.Checkpoint.WallTime, CheckpointSaved: st.CheckpointSave,
			CheckpointCT: st.Checkpoint.ClusterTime.T, LastEvent: st.LastEvent,
			Snapshot: snapshotStatus(st.Snapshot),
		}
		if st.Checkpoint.Token != nil {
			sr.CheckpointToken = st.Checkpoint.Token.String()
		}
		if !st.LastEvent.IsZero() && !st.Checkpoint.WallTime.IsZero() {
			sr.CheckpointLagSec = max(0, st.LastEvent.Sub(st.Checkpoint.WallTime).Seconds())
		}
		switch {
		case st.State == source.StateSnapshot:
			// Scanning is progress: ready unless the progress stalls.
			if st.InFlight > 0 && !st.CheckpointSave.IsZero() && time.Since(st.CheckpointSave) > staleAfter {
				sr.Reason = "snapshot progress has not advanced for " + time.Since(st.CheckpointSave).Round(time.Second).String()
			}
		case st.State != source.StateOpen:
			sr.Reason = "change stream is " + string(st.State)
			sr.Brief = sr.Reason
			if st.LastError != "" {
				sr.Reason += ": " + st.LastError
			}
		case time.Since(st.LastPoll) > g.stuckAfter:
			sr.Reason = "change stream has not answered for " + time.Since(st.LastPoll).Round(time.Second).String()
		case st.InFlight > 0 && !st.CheckpointSave.IsZero() && time.Since(st.CheckpointSave) > staleAfter:
			sr.Reason = "checkpoint has not advanced for " + time.Since(st.CheckpointSave).Round(time.Second).String()
		}
		if sr.Brief == "" {
			sr.Brief = sr.Reason
		}
		sr.Ready = sr.Reason == ""
		r.Ready = r.Ready && sr.Ready
		r.Sources = append(r.Sources, sr)
	}
	for _, l := range g.engine.Lanes() {
		st := l.Status()
		kr := api.SinkStatus{
			Name: st.Name, Queued: st.Queued, InProgress: st.InProgress, Parked: st.Parked,
			Failing: st.Failing, LastError: st.LastError, LastSuccess: st.LastSuccess,
			PausedUntil: st.PausedUntil,
			Adaptive:    st.Limit.Adaptive, ConcurrencyLimit: st.Limit.Limit, Requests: st.Limit.InFlight,
			LatencyMs: float64(st.Limit.RTT.Microseconds()) / 1000, Circuit: st.Limit.Circuit,
		}
		// A parked sink does not hold the sources back, but it is not
		// delivering: report it so an operator sees it.
		if st.Failing && st.Queued+st.InProgress > 0 && time.Since(st.LastSuccess) > staleAfter {
			kr.Brief = "sink has not delivered for " + time.Since(st.LastSuccess).Round(time.Second).String()
			kr.Reason = kr.Brief + ": " + st.LastError
		}
		kr.Ready = kr.Reason == ""
		r.Ready = r.Ready && kr.Ready
		r.Sinks = append(r.Sinks, kr)
	}
	return r
}
