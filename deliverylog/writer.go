package deliverylog

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/changegate/changegate/config"
)

// Defaults of WriterOptions.
const (
	DefaultMaxQueuedRecords = 10000
	DefaultMaxQueuedBytes   = 8 << 20
	DefaultMaxBatch         = 500
	DefaultFlushEvery       = 200 * time.Millisecond
	DefaultWriteTimeout     = 10 * time.Second
)

// WriterOptions configure a Writer. Zero values take the defaults.
type WriterOptions struct {
	// Mode is the configured mode (config.DeliveryLogFailures, All or
	// Off); empty means failures.
	Mode string
	// Replica names this instance in its records (config.Cluster.Instance).
	Replica string
	// MaxQueuedRecords and MaxQueuedBytes bound the records held, queued
	// or being written; past either, new records are dropped.
	MaxQueuedRecords int
	MaxQueuedBytes   int64
	// MaxBatch is the most records of one InsertMany.
	MaxBatch int
	// FlushEvery is how long the writer gathers records before a write,
	// unless MaxBatch are waiting.
	FlushEvery time.Duration
	// WriteTimeout bounds one InsertMany.
	WriteTimeout time.Duration
	// Logger gets the writer's errors (once per change of error); nil
	// discards them.
	Logger *slog.Logger
	// Registerer gets the writer's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Reasons a record is dropped, the reason label of
// changegate_delivery_log_dropped_total.
const (
	DropQueueFull   = "queue_full"
	DropWriteFailed = "write_failed"
	DropStopped     = "stopped"
)

// Writer queues records and writes them to the log's collection in the
// background. Enqueue is safe for concurrent use, never blocks and never
// waits for MongoDB. A nil *Writer (mode "off") takes nothing.
type Writer struct {
	coll *mongo.Collection
	opt  WriterOptions
	all  bool
	log  *slog.Logger

	mu      sync.Mutex
	queue   []Record
	spare   []Record // the other buffer: the queue's, while it is written
	count   int      // records held: queued and being written
	bytes   int64
	stopped bool

	wake    chan struct{} // a record was queued
	full    chan struct{} // MaxBatch records are queued
	quit    chan struct{}
	done    chan struct{}
	started atomic.Bool
	// writes is the context of the goroutine's writes, cancelled by a Stop
	// whose context ended.
	writes       context.Context
	cancelWrites context.CancelFunc

	dropped   [3]prometheus.Counter // by reason: queue_full, write_failed, stopped
	droppedN  atomic.Int64
	written   prometheus.Counter
	writtenN  atomic.Int64
	lastError string
}

// NewWriter returns a Writer into coll, or nil when opt.Mode is "off".
// Start starts its goroutine; until then records are queued.
func NewWriter(coll *mongo.Collection, opt WriterOptions) *Writer {
	if opt.Mode == config.DeliveryLogOff {
		return nil
	}
	if opt.MaxQueuedRecords <= 0 {
		opt.MaxQueuedRecords = DefaultMaxQueuedRecords
	}
	if opt.MaxQueuedBytes <= 0 {
		opt.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = DefaultMaxBatch
	}
	if opt.FlushEvery <= 0 {
		opt.FlushEvery = DefaultFlushEvery
	}
	if opt.WriteTimeout <= 0 {
		opt.WriteTimeout = DefaultWriteTimeout
	}
	w := &Writer{
		coll: coll, opt: opt, all: opt.Mode == config.DeliveryLogAll, log: opt.Logger,
		wake: make(chan struct{}, 1), full: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
	}
	w.writes, w.cancelWrites = context.WithCancel(context.Background())
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "changegate_delivery_log_dropped_total",
		Help: "Delivery log records dropped, by reason: queue_full (MongoDB did not keep up), write_failed, stopped (left at shutdown).",
	}, []string{"reason"})
	w.written = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "changegate_delivery_log_written_total",
		Help: "Delivery log records written to MongoDB.",
	})
	for i, reason := range []string{DropQueueFull, DropWriteFailed, DropStopped} {
		w.dropped[i] = dropped.WithLabelValues(reason)
	}
	if opt.Registerer != nil {
		opt.Registerer.MustRegister(dropped, w.written)
	}
	return w
}

// Wants reports whether a record with outcome o would be kept: in mode
// "failures" every outcome but delivered, in mode "all" every one. Callers
// ask before they build a record, so that the default mode costs a
// successful delivery one comparison. False for a nil Writer.
func (w *Writer) Wants(o Outcome) bool {
	return w != nil && (w.all || o != OutcomeDelivered)
}

// Enqueue queues r for writing and reports whether it was queued: false
// when the mode does not want it, when the writer is stopped, and when
// the queue is full (the record is dropped and counted). It sets r.Time
// when zero and cuts r.Response to MaxExcerpt bytes; it never blocks.
func (w *Writer) Enqueue(r Record) bool {
	if !w.Wants(r.Outcome) {
		return false
	}
	if r.Time.IsZero() {
		r.Time = time.Now()
	}
	if len(r.Response) > MaxExcerpt {
		// A copy: the record must not hold a larger answer alive.
		r.Response = string([]byte(r.Response[:MaxExcerpt]))
	}
	size := r.size()
	w.mu.Lock()
	if w.stopped || w.count >= w.opt.MaxQueuedRecords || w.bytes+size > w.opt.MaxQueuedBytes {
		stopped := w.stopped
		w.mu.Unlock()
		if stopped {
			w.drop(DropStopped, 1)
		} else {
			w.drop(DropQueueFull, 1)
		}
		return false
	}
	w.queue = append(w.queue, r)
	w.count++
	w.bytes += size
	n := len(w.queue)
	w.mu.Unlock()
	if n == 1 {
		signal(w.wake)
	}
	if n == w.opt.MaxBatch {
		signal(w.full)
	}
	return true
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (w *Writer) drop(reason string, n int) {
	i := 0
	switch reason {
	case DropWriteFailed:
		i = 1
	case DropStopped:
		i = 2
	}
	w.dropped[i].Add(float64(n))
	w.droppedN.Add(int64(n))
}

// Dropped returns the number of records dropped so far, for any reason.
func (w *Writer) Dropped() int64 {
	if w == nil {
		return 0
	}
	return w.droppedN.Load()
}

// Written returns the number of records written so far.
func (w *Writer) Written() int64 {
	if w == nil {
		return 0
	}
	return w.writtenN.Load()
}

// Start starts the writer's goroutine. It is a no-op on a nil Writer and
// after the first call.
func (w *Writer) Start() {
	if w == nil || !w.started.CompareAndSwap(false, true) {
		return
	}
	go w.run()
}

// Stop stops taking records, writes what is queued within ctx, and
// returns once the goroutine ended. What cannot be written before ctx
// ends is dropped (reason "stopped"); the error is then ctx's.
func (w *Writer) Stop(ctx context.Context) error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	already := w.stopped
	w.stopped = true
	w.mu.Unlock()
	if !w.started.Load() {
		w.mu.Lock()
		n := len(w.queue)
		w.queue, w.count, w.bytes = nil, 0, 0
		w.mu.Unlock()
		w.drop(DropStopped, n)
		return nil
	}
	if !already {
		close(w.quit)
	}
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		// The write in progress ends now; what is left is dropped.
		w.cancelWrites()
		<-w.done
		return ctx.Err()
	}
}

// run is the writer's goroutine.
func (w *Writer) run() {
	defer close(w.done)
	defer w.cancelWrites()
	stopCtx := w.writes
	for {
		select {
		case <-w.wake:
		case <-w.quit:
			w.flush(stopCtx, true)
			return
		}
		w.mu.Lock()
		ready := len(w.queue) >= w.opt.MaxBatch
		w.mu.Unlock()
		if !ready {
			t := time.NewTimer(w.opt.FlushEvery)
			select {
			case <-t.C:
			case <-w.full:
			case <-w.quit:
			}
			t.Stop()
		}
		w.flush(stopCtx, false)
	}
}

// flush writes every queued record, MaxBatch at a time. final: the writer
// is stopping (its last flush).
func (w *Writer) flush(ctx context.Context, final bool) {
	w.mu.Lock()
	all := w.queue
	w.queue, w.spare = w.spare[:0], nil
	w.mu.Unlock()
	batch := all
	for len(batch) > 0 {
		n := min(len(batch), w.opt.MaxBatch)
		if ctx.Err() != nil {
			w.drop(DropStopped, n)
		} else {
			w.write(ctx, batch[:n])
		}
		var size int64
		for i := range batch[:n] {
			size += batch[i].size()
			batch[i] = Record{} // let go of what it points to
		}
		w.mu.Lock()
		w.count -= n
		w.bytes -= size
		w.mu.Unlock()
		batch = batch[n:]
	}
	if !final {
		w.mu.Lock()
		w.spare = all[:0]
		w.mu.Unlock()
	}
}

// write inserts recs (unordered: one bad record does not stop the others).
func (w *Writer) write(ctx context.Context, recs []Record) {
	docs := make([]any, len(recs))
	for i := range recs {
		docs[i] = recs[i].store(w.opt.Replica)
	}
	ctx, cancel := context.WithTimeout(ctx, w.opt.WriteTimeout)
	defer cancel()
	_, err := w.coll.InsertMany(ctx, docs, options.InsertMany().SetOrdered(false))
	written := len(recs)
	if err != nil {
		// The result lists every id sent, written or not: count from the
		// error. Only write errors tell which were written.
		written = 0
		var bwe mongo.BulkWriteException
		if errors.As(err, &bwe) && bwe.WriteConcernError == nil && len(bwe.WriteErrors) > 0 {
			written = len(recs) - len(bwe.WriteErrors)
		}
	}
	if failed := len(recs) - written; failed > 0 {
		w.drop(DropWriteFailed, failed)
	}
	w.written.Add(float64(written))
	w.writtenN.Add(int64(written))
	if msg := errText(err); msg != w.lastError {
		w.lastError = msg
		if err != nil {
			w.log.Warn("delivery log: write failed; records dropped", "records", len(recs)-written, "error", err)
		} else {
			w.log.Info("delivery log: writing again")
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
