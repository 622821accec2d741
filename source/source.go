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

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/metrics"
)

// History-lost policies.
const (
	HistoryLostFail          = "fail"
	HistoryLostResumeFromNow = "resume_from_now"
)

// ErrHistoryLost is returned (wrapped) by Run when the checkpoint is older
// than the oplog and the source is configured to fail, and by Reread when
// the oplog no longer holds its start.
var ErrHistoryLost = errors.New("change stream history lost")

// Spec configures a Source.
type Spec struct {
	// Name is the [[sources]] entry's name; event ids are "<Name>:<token>",
	// whatever the partitioning.
	Name string
	// Unit is the unit of work this Source reads: Name itself, or
	// UnitName(Name, Partition, Partitions). It keys the checkpoint and
	// names the Source in logs, status and metrics. Empty means Name.
	Unit string
	// Partition and Partitions: with Partitions > 1 the Source reads only
	// the changes whose documentKey hashes to Partition (see Filter); the
	// changes without a documentKey (drop, rename, dropDatabase,
	// invalidate) are dispatched by partition 0 only.
	Partition, Partitions int
	// Tenure, in cluster mode, is the lease tenure under which the Source
	// runs: every event carries it, and checkpoint saves are fenced by its
	// epoch. A save refused by a newer epoch (or one that would move the
	// checkpoint backwards) ends the tenure and stops the Source. Nil
	// outside cluster mode.
	Tenure               *event.Tenure
	Database, Collection string // empty Database: the whole cluster; empty Collection: the database
	// StateDatabase is changegate's own state database (checkpoints, dead
	// letters, leases): a cluster-level Source never reads it, neither in
	// its stream (StateFilter, first in the pipeline, and again on each
	// change read) nor in its snapshot. Its writes would otherwise become
	// events, and a dead letter (which holds the raw change) an event
	// again. The configuration refuses a source of that database.
	StateDatabase            string
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
	// Budget is the process's byte budget (max_in_flight_bytes), shared
	// with every other source, unit and lane: each change read is admitted
	// against it, where MaxInFlight admits its count, and the Source stops
	// reading while it is spent. Nil: bytes are not counted.
	Budget             *memory.Budget
	CheckpointInterval time.Duration
	// Snapshot is SnapshotNever (default) or SnapshotInitial: on a start
	// without a checkpoint, deliver every existing document first (see
	// snapshot.go).
	Snapshot string
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
	// List returns every checkpoint; a unit without one inherits from the
	// checkpoints of its source's previous partitioning (see Inherit).
	List(ctx context.Context) ([]checkpoint.Checkpoint, error)
}

// ErrLeaseLost is returned (wrapped) by Run when a checkpoint save was
// refused because another replica claimed the unit (checkpoint.ErrFenced)
// or the save would move the checkpoint backwards (checkpoint.ErrBackwards):
// this process no longer owns the unit; the Source ended its tenure and
// stopped without a final save.
var ErrLeaseLost = errors.New("lease of the unit lost")

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
	// StateSnapshot: the initial snapshot scans the collections; the
	// change stream opens after it.
	StateSnapshot State = "snapshot"
)

// Status is a snapshot of a source.
type Status struct {
	// Name is the unit's name (the source's name when it has one unit).
	Name string
	// Source is the [[sources]] entry's name.
	Source         string
	State          State
	LastError      string
	InFlight       int
	Checkpoint     checkpoint.Position
	CheckpointSave time.Time // when the checkpoint was last persisted
	LastEvent      time.Time // wall time of the newest change read
	LastPoll       time.Time // when the stream last answered a getMore
	OpenedAt       time.Time
	// Snapshot is the progress of the initial snapshot run by this
	// process, nil when none ran.
	Snapshot *SnapshotStatus
}

// Source reads one change stream. Create it with New; Run it once.
type Source struct {
	spec   Spec
	client *mongo.Client
	cps    CheckpointStore
	gaps   GapRecorder
	out    Dispatcher
	keyed  KeyedDispatcher // out, when it takes the ordering key's hash
	log    *slog.Logger

	mRead, mReconnect, mInvalidate, mHistoryLost, mSaves prometheus.Counter
	mInFlight, mLag, mFailures                           prometheus.Gauge
	mSplit, mOversize                                    prometheus.Counter
	mTxns                                                prometheus.Counter
	mTxnEvents                                           prometheus.Observer
	mSnapDocs                                            prometheus.Counter
	mSnapEstimated, mSnapRunning                         prometheus.Gauge

	stopReading chan struct{}
	stopOnce    sync.Once
	reopen      chan struct{} // a reconfiguration asks the stream to reopen
	abandon     chan struct{} // closed: stop at once, without a final save
	abandonOnce sync.Once
	lostErr     error // set before abandon is closed when a save was fenced

	// clientFilter: the server lacks $toHashedIndexKey, so the partition is
	// filtered here (set by the reading goroutine only).
	clientFilter bool

	mu      sync.Mutex
	tracker *checkpoint.Tracker
	// streaming is set once tracker is the change stream's (not a
	// snapshot's): Acked reports its watermark.
	streaming bool
	status    Status
	// splitKnown: the server version was asked; splitOK: it has
	// $changeStreamSplitLargeEvent (split.go).
	splitKnown, splitOK bool
	// snap is the initial snapshot's progress (nil: none); snapBase the
	// documents done before this process resumed it.
	snap     *SnapshotStatus
	snapBase int64

	// order serialises dispatches with backfill events (order.go).
	order dispatchOrder
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
	if spec.Unit == "" {
		spec.Unit = spec.Name
	}
	if spec.Partitions < 1 {
		spec.Partitions = 1
	}
	log = log.With("source", spec.Name)
	if spec.Unit != spec.Name {
		log = log.With("unit", spec.Unit)
	}
	if spec.Tenure != nil {
		log = log.With("epoch", spec.Tenure.Epoch)
	}
	// Metrics are per unit: the "source" label is the unit's name, which
	// is the source's name unless it is partitioned.
	u := spec.Unit
	keyed, _ := out.(KeyedDispatcher)
	return &Source{
		spec: spec, client: client, cps: cps, gaps: gaps, out: out, keyed: keyed,
		log:            log,
		mRead:          m.EventsRead.WithLabelValues(u),
		mReconnect:     m.StreamReconnects.WithLabelValues(u),
		mInvalidate:    m.StreamInvalidates.WithLabelValues(u),
		mHistoryLost:   m.HistoryLost.WithLabelValues(u),
		mSaves:         m.CheckpointSaves.WithLabelValues(u),
		mInFlight:      m.InFlight.WithLabelValues(u),
		mLag:           m.CheckpointLag.WithLabelValues(u),
		mFailures:      m.StreamFailures.WithLabelValues(u),
		mSplit:         m.SplitEvents.WithLabelValues(u),
		mOversize:      m.OversizeEvents.WithLabelValues(u),
		mTxns:          m.Transactions.WithLabelValues(u),
		mTxnEvents:     m.TransactionEvents.WithLabelValues(u),
		mSnapDocs:      m.SnapshotDocuments.WithLabelValues(u),
		mSnapEstimated: m.SnapshotEstimated.WithLabelValues(u),
		mSnapRunning:   m.SnapshotRunning.WithLabelValues(u),
		stopReading:    make(chan struct{}),
		reopen:         make(chan struct{}, 1),
		abandon:        make(chan struct{}),
		status:         Status{Name: spec.Unit, Source: spec.Name, State: StateStarting},
	}
}

// Name returns the source's name.
func (s *Source) Name() string { return s.spec.Name }

// Unit returns the name of the unit of work the Source reads.
func (s *Source) Unit() string { return s.spec.Unit }

// Abandon makes Run stop at once without saving the checkpoint again (the
// unit's lease is lost: another replica may own it already). Events still
// in flight stay unacknowledged; the unit's owner re-reads them.
func (s *Source) Abandon() { s.abandonOnce.Do(func() { close(s.abandon) }) }

// leaseLost ends the tenure and abandons the Source after a fenced save.
func (s *Source) leaseLost(err error) {
	s.abandonOnce.Do(func() {
		s.mu.Lock()
		s.lostErr = fmt.Errorf("unit %s: %w: %w", s.spec.Unit, ErrLeaseLost, err)
		s.mu.Unlock()
		s.spec.Tenure.End()
		s.log.Error("checkpoint save refused: another replica owns the unit now; stopping it without saving", "err", err)
		close(s.abandon)
	})
}

func isFenced(err error) bool {
	return errors.Is(err, checkpoint.ErrFenced) || errors.Is(err, checkpoint.ErrBackwards)
}

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

// Acked returns the cluster time of the source's watermark: every change it
// read up to that point was acknowledged (delivered, dead-lettered or
// parked by every sink). ok is false until the change stream runs (while
// the source loads, or scans an initial snapshot). A lane re-drives a
// parked entry only once its unit's source acknowledged past the entry's
// position, so that the earlier changes re-read after a restart are parked
// (in their place) before a later parked change is re-driven.
func (s *Source) Acked() (ct bson.Timestamp, ok bool) {
	s.mu.Lock()
	tr, streaming := s.tracker, s.streaming
	s.mu.Unlock()
	if tr == nil || !streaming {
		return bson.Timestamp{}, false
	}
	pos, _ := tr.Position()
	return pos.ClusterTime, true
}

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
	st.Snapshot = s.snapshotStatusLocked()
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
	switch {
	case s.spec.Snapshot == SnapshotInitial && (!found || cp.Snapshot != nil):
		next, done, err := s.runSnapshot(ctx, cp, found)
		if !done {
			s.setState(StateStopped, nil)
			if err != nil {
				return err
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.lostErr
		}
		cp, found = next, true
	case found && cp.Snapshot != nil:
		s.log.Warn("the checkpoint holds an unfinished initial snapshot but the source has snapshot = \"never\": continuing with the change stream only",
			"snapshot", cp.Snapshot.ID, "documents_done", cp.Snapshot.Scanned)
	}
	start := checkpoint.Position{}
	if found {
		start = checkpoint.Position{Token: cp.Token, ClusterTime: cp.ClusterTime, WallTime: cp.WallTime}
		s.log.Info("resuming from checkpoint", "cluster_time", cp.ClusterTime, "saved_at", cp.UpdatedAt)
	}
	tr := s.newTracker(start)
	s.mu.Lock()
	s.tracker = tr
	s.streaming = true
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
		if !s.abandoned() {
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := saver.save(fctx); err != nil {
				s.log.Error("final checkpoint save failed", "err", err)
			}
		}
		s.setState(StateStopped, nil)
	}()

	readCtx, cancelRead := s.readContext(ctx)
	defer cancelRead()
	rerr := s.read(readCtx, tr, saver, start.Token, !found)
	if rerr != nil && !s.abandoned() {
		return rerr
	}
	// Stopped reading: keep checkpointing until the app cancels ctx.
	select {
	case <-ctx.Done():
	case <-s.abandon:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostErr
}

// abandoned reports whether Abandon was called or a save was fenced.
func (s *Source) abandoned() bool {
	select {
	case <-s.abandon:
		return true
	default:
		return false
	}
}

func (s *Source) load(ctx context.Context) (checkpoint.Checkpoint, bool, error) {
	wait := 100 * time.Millisecond
	for {
		cp, found, err := s.loadOrInherit(ctx)
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
	// tx: the transaction being read; pos starts at the checkpoint.
	pos, _ := tr.Position()
	tx := &txnState{pos: pos}
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
					s.resumePoint(tr, tx, rt)
					token = rt
					if err := saver.save(ctx); err != nil {
						if isFenced(err) {
							_ = cs.Close(context.WithoutCancel(ctx))
							s.leaseLost(err)
							return nil
						}
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
			token, invalidated, progressed, err = s.consume(streamCtx, cs, tr, tx, token, failures > 0)
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
		if s.spec.Partitions > 1 && !s.clientFilter && isUnsupportedHash(err) {
			s.clientFilter = true
			s.log.Warn("the server does not know $toHashedIndexKey (added in MongoDB 7.0 and in patch releases of 4.2-6.x): this partition reads every change and keeps its own share, filtering in changegate", "err", err)
			continue
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
			tx.reset()
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
			s.resumePoint(tr, tx, tok)
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

// readContext returns a context for reading the stream (or the snapshot's
// collections) that ends with ctx, a stop of reading or an abandon.
func (s *Source) readContext(ctx context.Context) (context.Context, context.CancelFunc) {
	readCtx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.stopReading:
			cancel()
		case <-s.abandon:
			cancel()
		case <-readCtx.Done():
		}
	}()
	return readCtx, cancel
}
