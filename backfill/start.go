package backfill

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/lease"
	"github.com/changegate/changegate/query"
)

// ParseFilter parses a backfill filter: a JSON object in MongoDB
// query syntax (as accepted by rules' filters: the query operators, no
// $where, $expr or $function, no regular expression MongoDB could backtrack
// on catastrophically: query.BacktrackRisk), at most 16 KiB. Empty means
// every document.
func ParseFilter(s string) (bson.Raw, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if len(s) > maxFilter {
		return nil, fmt.Errorf("filter of %d bytes: at most %d", len(s), maxFilter)
	}
	if !strings.HasPrefix(s, "{") {
		return nil, errors.New(`filter must be a JSON object in MongoDB query syntax, e.g. {"status": "paid"}`)
	}
	var d bson.D
	if err := bson.UnmarshalExtJSON([]byte(s), false, &d); err != nil {
		return nil, fmt.Errorf("filter is not valid Extended JSON: %v", err)
	}
	raw, err := bson.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("filter: %v", err)
	}
	if _, err := query.Compile(raw); err != nil {
		return nil, fmt.Errorf("filter is not a valid query: %v", err)
	}
	// The filter runs inside MongoDB (find, count): a pattern its
	// backtracking regex engine could take exponential time on is refused.
	if why := query.BacktrackRisk(raw); why != "" {
		return nil, fmt.Errorf("filter refused: %s; rewrite the pattern without the nested repetition", why)
	}
	return raw, nil
}

// validate checks req against cfg and returns the parsed filter and the
// sinks it targets.
func (b *Runner) validate(cfg *config.Config, req *Request) (bson.Raw, []string, error) {
	switch req.Kind {
	case KindRedelivery:
		return b.validateRedelivery(cfg, req)
	case "":
	default:
		return nil, nil, fmt.Errorf("%w: unknown kind %q (%q, or none for a backfill)", ErrInput, req.Kind, KindRedelivery)
	}
	var names []string
	var src *config.Source
	for i := range cfg.Sources {
		names = append(names, cfg.Sources[i].Name)
		if cfg.Sources[i].Name == req.Source {
			src = &cfg.Sources[i]
		}
	}
	if req.Source == "" {
		return nil, nil, fmt.Errorf("%w: source is required (one of %s)", ErrInput, strings.Join(names, ", "))
	}
	if src == nil {
		return nil, nil, fmt.Errorf("%w: unknown source %q (sources: %s)", ErrInput, req.Source, strings.Join(names, ", "))
	}
	routed := b.sinksOf(req.Source)
	sinks := routed
	if req.Sink != "" {
		known := false
		var all []string
		for _, s := range cfg.Sinks {
			all = append(all, s.Name)
			known = known || s.Name == req.Sink
		}
		if !known {
			return nil, nil, fmt.Errorf("%w: unknown sink %q (sinks: %s)", ErrInput, req.Sink, strings.Join(all, ", "))
		}
		if !slices.Contains(routed, req.Sink) {
			return nil, nil, fmt.Errorf("%w: no rule routes source %q to sink %q: add one (with \"snapshot\" in its operations, if it lists operations) first", ErrInput, req.Source, req.Sink)
		}
		sinks = []string{req.Sink}
	}
	if len(sinks) == 0 {
		return nil, nil, fmt.Errorf("%w: no rule of source %q routes to any sink", ErrInput, req.Source)
	}
	filter, err := checkRateFilter(req)
	return filter, sinks, err
}

// checkRateFilter checks req's rate (giving it the default) and parses
// its filter.
func checkRateFilter(req *Request) (bson.Raw, error) {
	if req.Rate == 0 {
		req.Rate = DefaultRate
	}
	if req.Rate < 0 || req.Rate > MaxRate || req.Rate != req.Rate {
		return nil, fmt.Errorf("%w: rate %v: want documents per second, more than 0 and at most %d", ErrInput, req.Rate, MaxRate)
	}
	filter, err := ParseFilter(req.Filter)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInput, err)
	}
	return filter, nil
}

// validateRedelivery is validate for a redelivery from the oplog: a sink
// (ErrUnknownSink when the configuration has none of that name), the one
// source whose rules route to it (or the one named), and a window in the
// past.
func (b *Runner) validateRedelivery(cfg *config.Config, req *Request) (bson.Raw, []string, error) {
	var all []string
	known := false
	for _, s := range cfg.Sinks {
		all = append(all, s.Name)
		known = known || s.Name == req.Sink
	}
	switch {
	case req.Sink == "":
		return nil, nil, fmt.Errorf("%w: a redelivery needs its sink (one of %s)", ErrInput, strings.Join(all, ", "))
	case !known:
		return nil, nil, fmt.Errorf("%w %q (sinks: %s)", ErrUnknownSink, req.Sink, strings.Join(all, ", "))
	}
	var routed []string
	for _, sc := range cfg.Sources {
		if slices.Contains(b.sinksOf(sc.Name), req.Sink) {
			routed = append(routed, sc.Name)
		}
	}
	switch {
	case req.Source != "" && !slices.Contains(routed, req.Source):
		return nil, nil, fmt.Errorf("%w: no rule routes source %q to sink %q (sources routed there: %s)", ErrInput, req.Source, req.Sink, strings.Join(routed, ", "))
	case req.Source != "":
	case len(routed) == 0:
		return nil, nil, fmt.Errorf("%w: no rule routes any source to sink %q", ErrInput, req.Sink)
	case len(routed) > 1:
		return nil, nil, fmt.Errorf("%w: the rules route sources %s to sink %q: name one with source", ErrInput, strings.Join(routed, ", "), req.Sink)
	default:
		req.Source = routed[0]
	}
	if b.streams == nil {
		return nil, nil, fmt.Errorf("%w: this process cannot read the oplog again", ErrInput)
	}
	if _, ok := b.streams(req.Source); !ok {
		return nil, nil, fmt.Errorf("%w: unknown source %q", ErrInput, req.Source)
	}
	now := time.Now()
	switch {
	case req.Since.IsZero() || req.Until.IsZero():
		return nil, nil, fmt.Errorf("%w: since and until (RFC 3339 times) are required: the window of the oplog to read again", ErrInput)
	case !req.Since.Before(req.Until):
		return nil, nil, fmt.Errorf("%w: since %s is not before until %s", ErrInput, req.Since.Format(time.RFC3339), req.Until.Format(time.RFC3339))
	case req.Until.After(now.Add(time.Second)):
		return nil, nil, fmt.Errorf("%w: until %s is in the future: the oplog holds changes up to now only", ErrInput, req.Until.Format(time.RFC3339))
	}
	filter, err := checkRateFilter(req)
	return filter, []string{req.Sink}, err
}

// Start validates req against cfg, locks its sinks and starts the backfill
// under ctx (a stop of the process: the backfill is cancelled with it and
// resumes at the next start). It returns the new backfill's status; an
// error wrapping ErrInput or ErrBusy means nothing started.
func (b *Runner) Start(ctx context.Context, cfg *config.Config, req Request) (Status, error) {
	r, err := b.start(ctx, cfg, req)
	if err != nil {
		return Status{}, err
	}
	return r.status(), nil
}

// start is Start, returning the run.
func (b *Runner) start(ctx context.Context, cfg *config.Config, req Request) (*run, error) {
	return b.startRun(ctx, cfg, req, nil)
}

// startRun is start, resuming from rs when it is not nil.
func (b *Runner) startRun(ctx context.Context, cfg *config.Config, req Request, rs *resumePoint) (*run, error) {
	filter, sinks, err := b.validate(cfg, &req)
	if err != nil {
		return nil, err
	}
	var id string
	if rs != nil {
		id = rs.id
	} else {
		var idb [6]byte
		_, _ = rand.Read(idb[:])
		id = hex.EncodeToString(idb[:])
	}
	owner := b.instance + "/" + id
	var held []lease.Lease
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for _, l := range held {
			_, _ = b.locks.Release(rctx, l.Unit, l.Owner, l.Epoch)
		}
	}
	for _, s := range sinks {
		l, ok, err := b.locks.Acquire(ctx, "backfill:"+s, owner)
		if err != nil {
			release()
			return nil, fmt.Errorf("backfill: lock sink %s: %w", s, err)
		}
		if !ok {
			release()
			return nil, fmt.Errorf("%w: sink %q runs another backfill (one at a time per sink); cancel it or wait for it to finish", ErrBusy, s)
		}
		held = append(held, l)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r := &run{id: id, req: req, filter: filter, sinks: sinks, cancel: cancel, done: make(chan struct{}), resume: rs}
	r.st = Status{ID: id, Kind: req.Kind, Since: req.Since, Until: req.Until, Source: req.Source, Sink: req.Sink, Filter: req.Filter, Rate: req.Rate,
		State: "running", StartedAt: time.Now().UTC()}
	if rs != nil {
		r.st.Scanned = rs.scanned
		if !rs.startedAt.IsZero() {
			r.st.StartedAt = rs.startedAt.UTC()
		}
	}
	if err := b.saveRecord(ctx, r, "running"); err != nil {
		cancel()
		release()
		return nil, fmt.Errorf("backfill: record: %w", err)
	}
	b.mu.Lock()
	b.runs[id] = r
	b.order = append(b.order, id)
	b.pruneLocked()
	b.mu.Unlock()
	// A shutdown of the process (ctx) cancels the backfill too.
	stopOnCtx := context.AfterFunc(ctx, cancel)
	var src config.Source
	for _, s := range cfg.Sources {
		if s.Name == req.Source {
			src = s
		}
	}
	log := b.log.With("backfill", id, "source", req.Source, "sink", req.Sink)
	if req.Kind == KindRedelivery {
		log.Info("redelivery from the oplog started", "since", req.Since, "until", req.Until, "filter", req.Filter, "rate", req.Rate)
	} else {
		log.Info("backfill started", "filter", req.Filter, "rate", req.Rate)
	}
	go func() {
		defer close(r.done)
		defer stopOnCtx()
		defer release()
		defer cancel() // first: stops the lock renewal before the release
		lost := make(chan struct{})
		go b.renew(rctx, held, lost, cancel)
		saverDone := make(chan struct{})
		go func() {
			defer close(saverDone)
			b.saveProgress(rctx, r)
		}()
		var err error
		if req.Kind == KindRedelivery {
			err = b.reread(rctx, r, log)
		} else {
			err = b.scan(rctx, r, src, log)
		}
		// What was sent is finished first (bounded: a cancelled CLI run
		// stops its deliveries after this).
		for deadline := time.Now().Add(30 * time.Second); r.inFlight.Load() > 0 && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		r.mu.Lock()
		r.st.FinishedAt = time.Now().UTC()
		switch {
		case err == nil:
			r.st.State = "done"
		case rctx.Err() != nil:
			r.st.State = "cancelled"
			select {
			case <-lost:
				r.st.State, r.st.Error = "failed", "the sink's backfill lock was lost"
			default:
			}
		default:
			r.st.State, r.st.Error = "failed", err.Error()
		}
		st := r.st
		// What a finished run keeps is small: the filter's text cut, its
		// parsed form dropped.
		r.st.Filter = cutFilter(r.st.Filter)
		r.filter = nil
		r.mu.Unlock()
		cancel()
		<-saverDone
		switch {
		case st.State == "cancelled" && !r.userCancelled.Load():
			// The process is stopping: the record stays running, with
			// its last acknowledged progress, and the next start resumes.
			b.saveProgressNow(context.WithoutCancel(ctx), r)
			log.Info("backfill stopped with the process; it resumes on the next start", "scanned", st.Scanned)
		default:
			b.saveProgressNow(context.WithoutCancel(ctx), r)
			if err := b.saveRecord(context.WithoutCancel(ctx), r, st.State); err != nil {
				log.Warn("cannot record the backfill's end", "err", err)
			}
		}
		log.Info("backfill ended", "state", st.State, "scanned", st.Scanned, "sent", st.Sent, "err", st.Error)
		b.mu.Lock()
		b.pruneLocked()
		b.mu.Unlock()
	}()
	return r, nil
}

// renew keeps the sinks' locks while the backfill runs; a lock it cannot
// keep cancels the backfill.
func (b *Runner) renew(ctx context.Context, held []lease.Lease, lost chan struct{}, cancel context.CancelFunc) {
	t := time.NewTicker(leaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for i, l := range held {
			nl, ok, err := b.locks.Renew(ctx, l)
			if err == nil && ok {
				held[i] = nl
				continue
			}
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				close(lost)
				cancel()
				return
			}
			b.log.Warn("cannot renew a backfill lock; will retry", "err", err)
		}
	}
}
