// Package memory bounds, in bytes, what the process holds of change events,
// and sizes that bound (and the Go runtime's soft memory limit) from the
// container's memory limit.
//
// A [Budget] is one process-wide byte budget (max_in_flight_bytes) shared by
// every source, unit, lane, re-drive, replay and backfill. Readers admit
// what they read with [Budget.Acquire], which waits while the budget is
// spent (one event larger than the whole budget is admitted when nothing
// else is held, so it cannot deadlock). What the process derives from an
// admitted event while it holds it (shaped views, encoded envelopes) is
// charged to the same [Charge] with [Charge.Grow], which never waits: a
// reader that admits the next event waits until the derived bytes are
// returned too. A Charge is reference counted: every holder (the source
// until it dispatched the event, each sink lane it was handed to) releases
// its reference once, whatever the outcome, and the bytes return to the
// budget with the last reference.
package memory

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// HeldBackLogAfter is how long an Acquire waits before the budget logs that
// reading is held back by it.
const HeldBackLogAfter = 10 * time.Second

// TxnPartShare is the share of the budget (1/TxnPartShare) that one part
// of a transaction may hold when a transaction too large to be held whole
// goes out in parts: on the live path (source/txn.go), the parked re-drive
// (router/park.go) and replays (deadletter/replay.go).
const TxnPartShare = 16

// Budget is a byte budget: Acquire admits bytes while the bytes held stay
// within the limit. A nil *Budget admits everything and counts nothing. A
// Budget is safe for concurrent use.
//
// Every event read changes the budget a few times (admitted, grown by its
// encodings, returned), from the source and from the lanes: the bytes held
// are an atomic counter, and the lock only serialises the readers that wait
// for room.
type Budget struct {
	limit int64
	log   *slog.Logger
	// heldBackAfter is how long an Acquire waits before it logs
	// (HeldBackLogAfter; tests shorten it).
	heldBackAfter time.Duration
	// onChange, when set, is called with the change in bytes held after
	// every change (a metrics gauge's Add).
	onChange func(int64)

	used    atomic.Int64 // bytes held
	charges atomic.Int64 // charges not yet released (leak checks)
	// waiters counts the Acquires waiting for room: a return of bytes
	// wakes them only when there are some. A waiter counts itself before
	// it takes freed and looks at used again, and a return changes used
	// before it looks at waiters, so one of the two sees the other.
	waiters atomic.Int32

	mu    sync.Mutex
	freed chan struct{} // closed and replaced whenever bytes are returned to waiters
	// waitingSince is when the oldest waiting Acquire began (zero: none).
	waiting      int
	waitingSince time.Time
	heldBack     atomic.Int64 // total nanoseconds readers waited (metrics)
}

// NewBudget returns a budget of limit bytes (at least 1). log receives the
// "held back" lines (nil: none); onChange, when not nil, is called with
// the change in bytes held (positive: charged, negative: returned) after
// every change, from any goroutine, concurrently (keep it cheap: the sum
// of its arguments is the bytes held).
func NewBudget(limit int64, log *slog.Logger, onChange func(int64)) *Budget {
	if limit < 1 {
		limit = 1
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Budget{limit: limit, log: log, onChange: onChange, freed: make(chan struct{}), heldBackAfter: HeldBackLogAfter}
}

// Limit returns the budget in bytes (0 for a nil budget).
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// InUse returns the bytes held now.
func (b *Budget) InUse() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// Charges returns the number of charges not yet released: with InUse, what
// a leak test checks is back to zero.
func (b *Budget) Charges() int64 {
	if b == nil {
		return 0
	}
	return b.charges.Load()
}

// HeldBack returns how long readers have waited for the budget in total.
func (b *Budget) HeldBack() time.Duration {
	if b == nil {
		return 0
	}
	return time.Duration(b.heldBack.Load())
}

// Waiting reports since when a reader waits for the budget (zero: none
// waits).
func (b *Budget) Waiting() time.Time {
	if b == nil {
		return time.Time{}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waitingSince
}

// Acquire waits until n more bytes fit in the budget, or nothing at all is
// held (so an event larger than the whole budget is admitted alone), and
// returns a Charge of n bytes with one reference, held by the caller. It
// returns ctx's error, holding nothing, when ctx ends first. what names the
// reader in the "held back" log line. A nil budget returns a nil Charge
// (whose methods do nothing) at once.
func (b *Budget) Acquire(ctx context.Context, n int64, what string) (*Charge, error) {
	return b.AcquireBeside(ctx, n, what, 0)
}

// AcquireBeside is Acquire for a reader that itself holds own bytes it can
// return only once it has read more (the source's held transaction event,
// and what the grouped sinks keep of that transaction, source/txn.go): it
// waits until n more bytes fit in the budget, or the bytes held are no
// more than own (so the reader cannot wait for itself). With own = 0 it is
// Acquire.
func (b *Budget) AcquireBeside(ctx context.Context, n int64, what string, own int64) (*Charge, error) {
	if b == nil {
		return nil, nil
	}
	if n < 0 {
		n = 0
	}
	if b.tryCharge(n, own) {
		return b.newCharge(n), nil
	}
	start := time.Now()
	b.mu.Lock()
	b.waiters.Add(1)
	if b.waiting++; b.waiting == 1 {
		b.waitingSince = start
	}
	b.mu.Unlock()
	logAt := time.NewTimer(b.heldBackAfter)
	defer logAt.Stop()
	defer func() {
		b.mu.Lock()
		b.waiters.Add(-1)
		if b.waiting--; b.waiting == 0 {
			b.waitingSince = time.Time{}
		}
		b.mu.Unlock()
		b.heldBack.Add(int64(time.Since(start)))
	}()
	for {
		b.mu.Lock()
		freed := b.freed
		b.mu.Unlock()
		if b.tryCharge(n, own) {
			return b.newCharge(n), nil
		}
		select {
		case <-freed:
		case <-logAt.C:
			b.log.Warn("reading is held back by the byte budget (max_in_flight_bytes): the events held are not finished yet",
				"reader", what, "waiting", time.Since(start).Round(time.Second).String(),
				"want_bytes", n, "inflight_bytes", b.used.Load(), "budget_bytes", b.limit)
			logAt.Reset(b.heldBackAfter)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// TryAcquire is Acquire without waiting: nil, false when n bytes do not fit
// now.
func (b *Budget) TryAcquire(n int64) (*Charge, bool) {
	if b == nil {
		return nil, true
	}
	n = max(n, 0)
	if !b.tryCharge(n, 0) {
		return nil, false
	}
	return b.newCharge(n), true
}

// Force charges n bytes without waiting, even over the budget: for bytes
// that already exist and must be counted (a request body while it is
// sent). The next Acquire waits until they are returned.
func (b *Budget) Force(n int64) *Charge {
	if b == nil {
		return nil
	}
	n = max(n, 0)
	b.used.Add(n)
	return b.newCharge(n)
}

// tryCharge adds n to the bytes held if they fit: no more than own bytes
// are held (nothing, for a reader holding none), or the sum stays within
// the limit.
func (b *Budget) tryCharge(n, own int64) bool {
	for {
		used := b.used.Load()
		if used > own && used+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(used, used+n) {
			return true
		}
	}
}

// newCharge returns the Charge of n bytes already added to used.
func (b *Budget) newCharge(n int64) *Charge {
	if n > maxChargeBytes {
		panic("memory: charge over 256 TiB")
	}
	b.charges.Add(1)
	if b.onChange != nil {
		b.onChange(n)
	}
	c := &Charge{b: b}
	c.state.Store(oneRef | uint64(n))
	return c
}

// add changes the bytes held by d (negative: returned); released: a
// charge's last reference went.
func (b *Budget) add(d int64, released bool) {
	if used := b.used.Add(d); used < 0 {
		panic(fmt.Sprintf("memory: budget below zero (%d bytes): a charge was released twice", used))
	}
	if released {
		b.charges.Add(-1)
	}
	if b.onChange != nil && d != 0 {
		b.onChange(d)
	}
	if (d < 0 || released) && b.waiters.Load() > 0 {
		b.mu.Lock()
		close(b.freed) // wake the waiting readers
		b.freed = make(chan struct{})
		b.mu.Unlock()
	}
}

// A Charge's state is one word, changed by compare-and-swap: its
// references in the top 16 bits, its bytes below.
const (
	refShift = 48
	oneRef   = uint64(1) << refShift
	bytesOf  = oneRef - 1
	// maxChargeBytes is the most bytes one Charge counts (256 TiB).
	maxChargeBytes = int64(bytesOf)
	maxRefs        = 1<<(64-refShift) - 1
)

// Charge is the bytes one event (or one request, one page of entries)
// holds of a Budget. It starts with one reference. A nil *Charge does
// nothing (no budget). A Charge is safe for concurrent use.
type Charge struct {
	b     *Budget
	state atomic.Uint64 // references << refShift | bytes
}

// Bytes returns the bytes charged (0 after the last release).
func (c *Charge) Bytes() int64 {
	if c == nil {
		return 0
	}
	return int64(c.state.Load() & bytesOf)
}

// Grow charges n more bytes derived from the event (a shaped view, an
// encoding) without waiting. Growing a released charge does nothing: the
// event is no longer held.
//
// The budget counts bytes before a charge holds them and after it gave
// them back, so it never holds less than its charges (a Release that
// takes the grown bytes returns bytes already counted).
func (c *Charge) Grow(n int64) {
	if c == nil || n <= 0 {
		return
	}
	c.b.add(n, false)
	for {
		s := c.state.Load()
		if s>>refShift == 0 {
			c.b.add(-n, false) // released: not charged after all
			return
		}
		if int64(s&bytesOf)+n > maxChargeBytes {
			c.b.add(-n, false)
			panic("memory: charge over 256 TiB")
		}
		if c.state.CompareAndSwap(s, s+uint64(n)) {
			return
		}
	}
}

// Resize sets the bytes charged to n (a split change reassembled: its
// fragments replaced by the whole), without waiting.
func (c *Charge) Resize(n int64) {
	if c == nil || n < 0 {
		return
	}
	if n > maxChargeBytes {
		panic("memory: charge over 256 TiB")
	}
	for {
		s := c.state.Load()
		if s>>refShift == 0 {
			return
		}
		d := n - int64(s&bytesOf)
		if d > 0 {
			c.b.add(d, false) // counted before the charge holds it (Grow)
		}
		if c.state.CompareAndSwap(s, s&^bytesOf|uint64(n)) {
			if d < 0 {
				c.b.add(d, false)
			}
			return
		}
		if d > 0 {
			c.b.add(-d, false)
		}
	}
}

// Retain adds k references: one for each holder the event is handed to.
// Retaining a released charge panics: the accounting is broken.
func (c *Charge) Retain(k int) {
	if c == nil || k <= 0 {
		return
	}
	for {
		s := c.state.Load()
		refs := s >> refShift
		if refs == 0 {
			panic("memory: retain of a released charge")
		}
		if refs+uint64(k) > maxRefs {
			panic("memory: too many references to a charge")
		}
		if c.state.CompareAndSwap(s, s+uint64(k)<<refShift) {
			return
		}
	}
}

// Release drops one reference; the last returns the bytes to the budget.
// Releasing more often than references were taken panics: the accounting
// is broken.
func (c *Charge) Release() {
	if c == nil {
		return
	}
	for {
		s := c.state.Load()
		refs := s >> refShift
		if refs == 0 {
			panic("memory: charge released more often than retained")
		}
		next := s - oneRef
		if refs == 1 {
			next = 0 // the last reference: the bytes go back
		}
		if !c.state.CompareAndSwap(s, next) {
			continue
		}
		if refs == 1 {
			c.b.add(-int64(s&bytesOf), true)
		}
		return
	}
}

type budgetKey struct{}

// WithBudget returns ctx carrying b, for the code below a sink's Send that
// builds request bodies: it charges them with FromContext(ctx).Force while
// they are sent. A nil b returns ctx.
func WithBudget(ctx context.Context, b *Budget) context.Context {
	if b == nil {
		return ctx
	}
	return context.WithValue(ctx, budgetKey{}, b)
}

// FromContext returns the budget WithBudget put in ctx (nil: none).
func FromContext(ctx context.Context) *Budget {
	b, _ := ctx.Value(budgetKey{}).(*Budget)
	return b
}
