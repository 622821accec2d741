// Package source reads one MongoDB change stream per configured source,
// hands every change to the router and keeps the source's checkpoint: it
// resumes from the persisted token, reopens the stream itself after errors,
// follows invalidations and handles lost history as configured.
package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/metrics"
)

// History-lost policies.
const (
	HistoryLostFail          = "fail"
	HistoryLostResumeFromNow = "resume_from_now"
)

// ErrHistoryLost is returned (wrapped) by Run when the checkpoint is older
// than the oplog and the source is configured to fail.
var ErrHistoryLost = errors.New("change stream history lost")

// Spec configures a Source.
type Spec struct {
	Name                     string
	Database, Collection     string // empty Database: the whole cluster; empty Collection: the database
	FullDocument             string // default, updateLookup, whenAvailable, required
	FullDocumentBeforeChange string // off, whenAvailable, required
	Pipeline                 bson.A // extra stages after $changeStream (pushdown first, then these)
	Pushdown                 bson.D // $match stage from the rules, or nil
	StartAt                  time.Time
	OnHistoryLost            string
	SplitLargeEvents         string // SplitAuto (default) or SplitOff; see split.go
	OnOversizeEvent          string // OversizeFail (default) or OversizeSkip
	BatchSize                int32
	MaxAwait                 time.Duration
	MaxInFlight              int
	CheckpointInterval       time.Duration
}

// Dispatcher receives every change read; ack must be called exactly once
// when the change is handled by every sink.
type Dispatcher interface {
	Dispatch(ev *event.Event, ack func())
}

// CheckpointStore persists positions.
type CheckpointStore interface {
	Load(ctx context.Context, source string) (checkpoint.Checkpoint, bool, error)
	Save(ctx context.Context, cp checkpoint.Checkpoint) error
}

// GapRecorder records lost history.
type GapRecorder interface {
	Put(ctx context.Context, e deadletter.Entry) error
}

// State is the stream state reported in Status.
type State string

// Stream states.
const (
	StateStarting    State = "starting"
	StateOpen        State = "open"
	StateReconnect   State = "reconnecting"
	StateHistoryLost State = "history_lost"
	// StateFailed: stopped at a change it cannot read (on_oversize_event
	// = "fail"); acknowledged events are still checkpointed.
	StateFailed  State = "failed"
	StateStopped State = "stopped"
)

// Status is a snapshot of a source.
type Status struct {
	Name           string
	State          State
	LastError      string
	InFlight       int
	Checkpoint     checkpoint.Position
	CheckpointSave time.Time // when the checkpoint was last persisted
	LastEvent      time.Time // wall time of the newest change read
	LastPoll       time.Time // when the stream last answered a getMore
	OpenedAt       time.Time
}

// Source reads one change stream. Create it with New; Run it once.
type Source struct {
	spec   Spec
	client *mongo.Client
	cps    CheckpointStore
	gaps   GapRecorder
	out    Dispatcher
	log    *slog.Logger

	mRead, mReconnect, mInvalidate, mHistoryLost, mSaves prometheus.Counter
	mInFlight, mLag, mFailures                           prometheus.Gauge
	mSplit, mOversize                                    prometheus.Counter

	stopReading chan struct{}
	stopOnce    sync.Once
	reopen      chan struct{} // a reconfiguration asks the stream to reopen

	mu      sync.Mutex
	tracker *checkpoint.Tracker
	status  Status
	// splitKnown: the server version was asked; splitOK: it has
	// $changeStreamSplitLargeEvent (split.go).
	splitKnown, splitOK bool
}

// New returns a source; nothing happens until Run.
func New(spec Spec, client *mongo.Client, cps CheckpointStore, gaps GapRecorder, out Dispatcher, m *metrics.Metrics, log *slog.Logger) *Source {
	if spec.MaxInFlight < 1 {
		spec.MaxInFlight = 10000
	}
	if spec.CheckpointInterval <= 0 {
		spec.CheckpointInterval = time.Second
	}
	if spec.OnHistoryLost == "" {
		spec.OnHistoryLost = HistoryLostFail
	}
	if spec.SplitLargeEvents == "" {
		spec.SplitLargeEvents = SplitAuto
	}
	if spec.OnOversizeEvent == "" {
		spec.OnOversizeEvent = OversizeFail
	}
	if m == nil {
		m = metrics.New(nil)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{
		spec: spec, client: client, cps: cps, gaps: gaps, out: out,
		log:          log.With("source", spec.Name),
		mRead:        m.EventsRead.WithLabelValues(spec.Name),
		mReconnect:   m.StreamReconnects.WithLabelValues(spec.Name),
		mInvalidate:  m.StreamInvalidates.WithLabelValues(spec.Name),
		mHistoryLost: m.HistoryLost.WithLabelValues(spec.Name),
		mSaves:       m.CheckpointSaves.WithLabelValues(spec.Name),
		mInFlight:    m.InFlight.WithLabelValues(spec.Name),
		mLag:         m.CheckpointLag.WithLabelValues(spec.Name),
		mFailures:    m.StreamFailures.WithLabelValues(spec.Name),
		mSplit:       m.SplitEvents.WithLabelValues(spec.Name),
		mOversize:    m.OversizeEvents.WithLabelValues(spec.Name),
		stopReading:  make(chan struct{}),
		reopen:       make(chan struct{}, 1),
		status:       Status{Name: spec.Name, State: StateStarting},
	}
}

// Name returns the source's name.
func (s *Source) Name() string { return s.spec.Name }

// SetPushdown replaces the $match stage pushed into the change stream (after
// a rules reload). The stream reopens after the last change handed to the
// router, so no change is skipped or read twice.
func (s *Source) SetPushdown(stage bson.D) {
	s.mu.Lock()
	s.spec.Pushdown = stage
	s.mu.Unlock()
	select {
	case s.reopen <- struct{}{}:
	default:
	}
}

// StopReading makes Run stop reading new changes; events in flight are still
// delivered and acknowledged, and Run keeps saving the checkpoint until its
// context is cancelled.
func (s *Source) StopReading() { s.stopOnce.Do(func() { close(s.stopReading) }) }

// Drained returns a channel closed when no event of this source is in flight.
// It is closed at once before Run has started.
func (s *Source) Drained() <-chan struct{} {
	s.mu.Lock()
	tr := s.tracker
	s.mu.Unlock()
	if tr == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return tr.Drained()
}

// Status returns a snapshot of the source.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.status
	if s.tracker != nil {
		st.InFlight = s.tracker.InFlight()
	}
	return st
}

func (s *Source) setState(st State, err error) {
	s.mu.Lock()
	s.status.State = st
	if err != nil {
		s.status.LastError = err.Error()
	}
	if st == StateOpen {
		s.status.OpenedAt = time.Now()
		s.status.LastPoll = s.status.OpenedAt
	}
	s.mu.Unlock()
}

// Run reads the change stream until ctx is cancelled and returns nil then,
// after persisting the checkpoint one last time. After StopReading it stops
// reading but keeps checkpointing acknowledged events until ctx is cancelled.
// It returns an error wrapping ErrHistoryLost when the history is lost and the
// policy is "fail", or an error when the checkpoint store cannot be read.
func (s *Source) Run(ctx context.Context) error {
	cp, found, err := s.load(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the checkpoint could be read: a clean stop
		}
		return err
	}
	start := checkpoint.Position{}
	if found {
		start = checkpoint.Position{Token: cp.Token, ClusterTime: cp.ClusterTime, WallTime: cp.WallTime}
		s.log.Info("resuming from checkpoint", "cluster_time", cp.ClusterTime, "saved_at", cp.UpdatedAt)
	}
	tr := checkpoint.NewTracker(s.spec.MaxInFlight, start)
	s.mu.Lock()
	s.tracker = tr
	s.status.Checkpoint = start
	s.mu.Unlock()

	saver := newSaver(s, tr, start)
	var wg sync.WaitGroup
	saverCtx, stopSaver := context.WithCancel(context.WithoutCancel(ctx))
	wg.Add(1)
	go func() {
		defer wg.Done()
		saver.loop(saverCtx)
	}()
	defer func() {
		stopSaver()
		wg.Wait()
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := saver.save(fctx); err != nil {
			s.log.Error("final checkpoint save failed", "err", err)
		}
		s.setState(StateStopped, nil)
	}()

	readCtx, cancelRead := context.WithCancel(ctx)
	defer cancelRead()
	go func() {
		select {
		case <-s.stopReading:
			cancelRead()
		case <-readCtx.Done():
		}
	}()
	rerr := s.read(readCtx, tr, saver, start.Token, !found)
	if rerr != nil {
		return rerr
	}
	// Stopped reading: keep checkpointing until the app cancels ctx.
	<-ctx.Done()
	return nil
}

func (s *Source) load(ctx context.Context) (checkpoint.Checkpoint, bool, error) {
	wait := 100 * time.Millisecond
	for {
		cp, found, err := s.cps.Load(ctx, s.spec.Name)
		if err == nil {
			return cp, found, nil
		}
		if ctx.Err() != nil {
			return cp, false, ctx.Err()
		}
		s.setState(StateReconnect, err)
		s.log.Warn("cannot load checkpoint; retrying", "err", err)
		sleep(ctx, wait)
		wait = min(wait*2, 10*time.Second)
	}
}

// read runs the open/consume/reopen loop until ctx is done (nil) or history
// is lost with policy fail.
func (s *Source) read(ctx context.Context, tr *checkpoint.Tracker, saver *saver, token bson.Raw, fresh bool) error {
	backoff := 100 * time.Millisecond
	// failures counts stream failures since the stream last made progress
	// (read a change or answered a getMore): the backoff grows with it, and
	// a successful open alone does not reset it, so a getMore that fails
	// every time (a poison change, an injected fault) backs off to 30s
	// instead of reopening ten times a second.
	failures := 0
	// narrow: after BSONObjectTooLarge, read one change per batch until past
	// the large change, so that the changes before it in the failed batch
	// are delivered and the error names the very next change.
	narrow := false
	var startAt *bson.Timestamp
	if fresh && !s.spec.StartAt.IsZero() {
		startAt = &bson.Timestamp{T: uint32(s.spec.StartAt.Unix())}
	}
	for ctx.Err() == nil {
		cs, err := s.open(ctx, token, startAt, narrow)
		if err == nil {
			if failures == 0 {
				s.setState(StateOpen, nil)
			}
			if token == nil {
				// First start: persist the stream's initial position at
				// once, so a crash before the first event cannot skip it.
				if rt := cs.ResumeToken(); rt != nil {
					tr.SetResumePoint(rt)
					token = rt
					if err := saver.save(ctx); err != nil {
						s.log.Warn("cannot persist initial position", "err", err)
					}
				}
			}
			startAt = nil
			var invalidated bool
			streamCtx, cancelStream := context.WithCancel(ctx)
			go func() {
				select {
				case <-s.reopen:
					cancelStream()
				case <-streamCtx.Done():
				}
			}()
			var progressed bool
			before := token
			token, invalidated, progressed, err = s.consume(streamCtx, cs, tr, token, failures > 0)
			if progressed {
				if failures > 0 || backoff > 100*time.Millisecond {
					s.log.Info("change stream reads again", "after_failures", failures)
				}
				failures, backoff = 0, 100*time.Millisecond
				s.mFailures.Set(0)
			}
			if narrow && string(before) != string(token) {
				narrow = false
			}
			reconfigured := streamCtx.Err() != nil
			cancelStream()
			_ = cs.Close(context.WithoutCancel(ctx))
			if ctx.Err() != nil {
				return nil
			}
			if reconfigured {
				s.log.Info("reopening the change stream with the reloaded rules' filter")
				continue
			}
			if err == nil && invalidated {
				s.mInvalidate.Inc()
				s.log.Warn("change stream invalidated (collection or database dropped or renamed); reopening after the invalidate event")
				continue
			}
			if err == nil {
				err = errors.New("change stream closed by the server")
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if isHistoryLost(err) {
			s.mHistoryLost.Inc()
			if s.spec.OnHistoryLost != HistoryLostResumeFromNow {
				s.setState(StateHistoryLost, err)
				pos, _ := tr.Position()
				return fmt.Errorf("source %s: %w: the checkpoint (cluster time %d, %s) is older than the oldest change MongoDB still keeps in its oplog, so changes after it were never read. "+
					"To continue from now and record the gap in the dead-letter collection, set on_history_lost = \"resume_from_now\" for this source; "+
					"to start over deliberately, reset the checkpoint with `changegate checkpoints reset -source %s`: %v",
					s.spec.Name, ErrHistoryLost, pos.ClusterTime.T, formatTime(pos.WallTime), s.spec.Name, err)
			}
			if gerr := s.recordGap(ctx, tr, err); gerr != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.log.Error("cannot record history gap; retrying", "err", gerr)
				sleep(ctx, backoff)
				backoff = min(backoff*2, 30*time.Second)
				continue
			}
			token, startAt = nil, nil
			continue
		}
		if isTooLarge(err) {
			if !narrow {
				// The failed batch may have held changes before the large
				// one: read them one at a time first.
				narrow = true
				s.log.Warn("a change event is too large for MongoDB to return; reading one change per batch up to it", "err", err)
				continue
			}
			tok, ct, ok := oversizePosition(err)
			if s.spec.OnOversizeEvent != OversizeSkip || !ok {
				s.mOversize.Inc()
				pos, _ := tr.Position()
				where := "the change after the checkpoint (cluster time " + strconv.FormatUint(uint64(pos.ClusterTime.T), 10) + ")"
				if ok {
					where = fmt.Sprintf("the change with resume token %s (cluster time %d, %s)", event.TokenData(tok), ct.T, formatTime(time.Unix(int64(ct.T), 0)))
				}
				ferr := fmt.Errorf("source %s: %w: MongoDB cannot return %s because it is over 16 MB (BSONObjectTooLarge); "+
					"the server splits such events when split_large_events = \"auto\" and it is MongoDB 7.0 or 6.0.9+; "+
					"otherwise reduce the event (no full_document/full_document_before_change, or a $project in pipeline), "+
					"or set on_oversize_event = \"skip\" to record it as a gap in the dead-letter collection and go on: %v",
					s.spec.Name, ErrOversizeEvent, where, err)
				s.setState(StateFailed, ferr)
				s.log.Error("source stopped at a change event too large to read", "err", ferr)
				<-ctx.Done() // checkpointing goes on in Run; other sources too
				return nil
			}
			if gerr := s.recordOversize(ctx, tok, ct, err); gerr != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.log.Error("cannot record the skipped change; retrying", "err", gerr)
				sleep(ctx, backoff)
				backoff = min(backoff*2, 30*time.Second)
				continue
			}
			// Everything before it was handed on (one change per batch),
			// so the stream continues after it.
			tr.SetResumePoint(tok)
			token, narrow = tok, false
			continue
		}
		failures++
		s.mFailures.Set(float64(failures))
		s.mReconnect.Inc()
		s.setState(StateReconnect, err)
		s.log.Warn("change stream failed; reopening from the last position handed to the router", "err", err, "retry_in", backoff, "failures", failures)
		sleep(ctx, backoff)
		backoff = min(backoff*2, 30*time.Second)
	}
	return nil
}

func (s *Source) open(ctx context.Context, token bson.Raw, startAt *bson.Timestamp, narrow bool) (*mongo.ChangeStream, error) {
	opts := options.ChangeStream()
	if s.spec.FullDocument != "" && s.spec.FullDocument != "default" {
		opts.SetFullDocument(options.FullDocument(s.spec.FullDocument))
	}
	if s.spec.FullDocumentBeforeChange != "" && s.spec.FullDocumentBeforeChange != "off" {
		opts.SetFullDocumentBeforeChange(options.FullDocument(s.spec.FullDocumentBeforeChange))
	}
	if s.spec.BatchSize > 0 {
		opts.SetBatchSize(s.spec.BatchSize)
	}
	if narrow {
		opts.SetBatchSize(1)
	}
	if s.spec.MaxAwait > 0 {
		opts.SetMaxAwaitTime(s.spec.MaxAwait)
	}
	switch {
	case token != nil:
		// startAfter also works past an invalidate event.
		opts.SetStartAfter(token)
	case startAt != nil:
		opts.SetStartAtOperationTime(startAt)
	}
	pipeline := bson.A{}
	s.mu.Lock()
	push := s.spec.Pushdown
	s.mu.Unlock()
	if push != nil {
		pipeline = append(pipeline, push)
	}
	pipeline = append(pipeline, s.spec.Pipeline...)
	pipeline, err := s.splitPipeline(ctx, pipeline)
	if err != nil {
		return nil, err
	}
	switch {
	case s.spec.Database == "":
		return s.client.Watch(ctx, pipeline, opts)
	case s.spec.Collection == "":
		return s.client.Database(s.spec.Database).Watch(ctx, pipeline, opts)
	default:
		return s.client.Database(s.spec.Database).Collection(s.spec.Collection).Watch(ctx, pipeline, opts)
	}
}

// consume reads events until the stream ends or fails. It returns the resume
// token to reopen from (the last event handed to the router, or the newest
// post-batch token), whether the stream ended with an invalidate, whether
// it made progress (read a change or got an answer to a getMore), and the
// stream's error. recovering: the stream failed before without progress;
// its state turns open with the first progress.
func (s *Source) consume(ctx context.Context, cs *mongo.ChangeStream, tr *checkpoint.Tracker, token bson.Raw, recovering bool) (bson.Raw, bool, bool, error) {
	invalidated, progressed := false, false
	progress := func() {
		if !progressed && recovering {
			s.setState(StateOpen, nil)
			s.mFailures.Set(0)
		}
		progressed = true
	}
	// Fragments of a split event (split.go): the event is handed on whole,
	// after its last fragment; the post-batch token is not a resume point
	// while fragments are pending.
	var frags fragments
	polls := 0
	// A getMore that never answers (a network partition, a hung server)
	// would block forever: bound each one and reopen when it expires.
	pollTimeout := s.spec.MaxAwait + 10*time.Second
	if s.spec.MaxAwait <= 0 {
		pollTimeout = 11 * time.Second
	}
	for {
		var got bool
		if cs.RemainingBatchLength() > 0 {
			got = cs.TryNext(ctx)
		} else {
			pctx, cancel := context.WithTimeout(ctx, pollTimeout)
			got = cs.TryNext(pctx)
			cancel()
			s.mu.Lock()
			s.status.LastPoll = time.Now()
			s.mu.Unlock()
		}
		if got {
			progress()
			raw := make(bson.Raw, len(cs.Current))
			copy(raw, cs.Current)
			whole, err := frags.add(raw)
			if err != nil {
				// Reopen from the last whole event: the fragments come again
				// from the first.
				return token, false, progressed, err
			}
			if whole == nil {
				continue // more fragments to come
			}
			if len(whole) != len(raw) || string(whole) != string(raw) {
				s.mSplit.Inc()
			}
			raw = whole
			ev, err := event.FromChange(s.spec.Name, 0, raw)
			if err != nil {
				// The driver refuses a change without a document _id, so
				// this cannot loop on one change; reopen as for an error.
				return token, false, progressed, fmt.Errorf("malformed change event: %w", err)
			}
			seq, err := tr.Add(ctx, ev.Token, ev.ClusterTime, ev.WallTime)
			if err != nil {
				return token, false, progressed, nil // stopping
			}
			ev.Seq = seq
			s.mRead.Inc()
			s.mInFlight.Inc()
			token = ev.Token
			s.mu.Lock()
			s.status.LastEvent = ev.WallTime
			s.mu.Unlock()
			if ev.OperationType == "invalidate" {
				invalidated = true
			}
			s.out.Dispatch(ev, func() {
				tr.Ack(seq)
				s.mInFlight.Dec()
			})
			continue
		}
		if err := cs.Err(); err != nil {
			if ctx.Err() != nil {
				return token, false, progressed, nil
			}
			return token, false, progressed, err
		}
		// The first empty TryNext only consumes the aggregate's first
		// batch; the second one got an answer to a getMore.
		if polls++; polls >= 2 {
			progress()
		}
		if cs.ID() == 0 {
			// The server closed the cursor: an invalidate. Its event may have
			// been filtered out by the source's own pipeline stages; the
			// final post-batch token then marks it, and startAfter that
			// token continues after it.
			if rt := cs.ResumeToken(); rt != nil && !invalidated {
				tr.SetResumePoint(rt)
				token = rt
			}
			return token, true, progressed, nil
		}
		if rt := cs.ResumeToken(); rt != nil && cs.RemainingBatchLength() == 0 && !frags.pending() {
			tr.SetResumePoint(rt)
			token = rt
		}
	}
}

func (s *Source) recordGap(ctx context.Context, tr *checkpoint.Tracker, cause error) error {
	pos, _ := tr.Position()
	now := time.Now().UTC()
	from := pos.WallTime
	if from.IsZero() && pos.ClusterTime.T != 0 {
		from = time.Unix(int64(pos.ClusterTime.T), 0).UTC()
	}
	e := deadletter.Entry{
		ID:        deadletter.GapID(s.spec.Name, from),
		Kind:      deadletter.KindGap,
		Source:    s.spec.Name,
		Reason:    "history_lost",
		LastError: cause.Error(), FirstError: cause.Error(),
		GapFrom: from, GapTo: now, LastToken: pos.Token,
		CreatedAt: now, FirstFailedAt: now, LastFailedAt: now,
	}
	if err := s.gaps.Put(ctx, e); err != nil {
		return err
	}
	s.log.Error("change stream history lost: continuing from now; the gap is recorded in the dead-letter collection",
		"gap_from", formatTime(from), "gap_to", formatTime(now), "gap_id", e.ID)
	return nil
}

func isHistoryLost(err error) bool {
	var se mongo.ServerError
	if errors.As(err, &se) {
		return se.HasErrorCode(286)
	}
	return false
}

func formatTime(t time.Time) string {
	if t.IsZero() {
		return "unknown time"
	}
	return t.UTC().Format(time.RFC3339)
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
