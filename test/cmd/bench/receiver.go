package main

import (
	"bytes"
	"math/bits"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// receiver is a lean webhook receiver for the benchmark: it does not verify
// signatures (that would only add receiver CPU to a shared machine); it
// reads each body, finds every envelope's fullDocument "seq" and "wts"
// (write time, unix nanoseconds) fields, and answers 204. It counts
// envelopes per path ("/s0".."/s3"), detects duplicates and, when asked,
// records the latency from write to response of every envelope.
type receiver struct {
	srv *http.Server
	url string

	target     int64 // envelopes to wait for
	recordLat  bool
	firstReq   chan struct{} // closed on the first request
	count      atomic.Int64
	dups       atomic.Int64
	unparsed   atomic.Int64
	requests   atomic.Int64
	first      atomic.Int64 // unix nanos of the first envelope
	last       atomic.Int64 // unix nanos of the newest envelope
	seen       [4][]atomic.Uint64
	done       chan struct{}
	doneOnce   sync.Once
	latMu      sync.Mutex
	lat        []int64
	firstFired atomic.Bool

	// load shapes the receiver's answers (scenarios 10 and 11).
	load      receiverLoad
	active    atomic.Int64 // requests being served, with load.slots
	throttled atomic.Int64 // requests answered 429
	firstAt   atomic.Int64 // unix nanos of the first request
	lateReqs  atomic.Int64 // requests load.lateAfter or more after the first
	late429   atomic.Int64 // of which answered 429
	at10      atomic.Int64 // unix nanos when count reached target/10
	at90      atomic.Int64 // unix nanos when count reached target*9/10
}

// receiverLoad makes the receiver behave like a real one under load: each
// accepted request takes latency, and with slots > 0 at most slots requests
// are served at once, the others answered 429 with Retry-After: 1 at once.
type receiverLoad struct {
	latency   time.Duration
	slots     int64
	lateAfter time.Duration // requests this long after the first count as late
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// newReceiver listens on a free loopback port. target is the number of
// envelopes after which Done is closed; seqs bounds the "seq" values
// tracked for duplicates (per path).
func newReceiver(target int64, seqs int, recordLat bool) (*receiver, error) {
	return newLoadReceiver(target, seqs, recordLat, receiverLoad{})
}

// newLoadReceiver is newReceiver with a load behaviour.
func newLoadReceiver(target int64, seqs int, recordLat bool, load receiverLoad) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{target: target, recordLat: recordLat, done: make(chan struct{}), firstReq: make(chan struct{}), load: load}
	for i := range r.seen {
		r.seen[i] = make([]atomic.Uint64, (seqs+63)/64)
	}
	if recordLat {
		r.lat = make([]int64, 0, target)
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	r.url = "http://" + ln.Addr().String()
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) Close() { _ = r.srv.Close() }

// Done is closed once target envelopes have arrived.
func (r *receiver) Done() <-chan struct{} { return r.done }

var (
	seqKey = []byte(`"seq":`)
	wtsKey = []byte(`"wts":`)
)

// number parses a JSON integer at the start of b (after optional spaces).
func number(b []byte) (int64, bool) {
	i := 0
	for i < len(b) && b[i] == ' ' {
		i++
	}
	var v int64
	start := i
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		v = v*10 + int64(b[i]-'0')
		i++
	}
	return v, i > start
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(req.Body)
	if err != nil {
		bodyPool.Put(buf)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.requests.Add(1)
	if r.firstFired.CompareAndSwap(false, true) {
		r.firstAt.Store(time.Now().UnixNano())
		close(r.firstReq)
	}
	late := false
	if r.load.lateAfter > 0 {
		if f := r.firstAt.Load(); f != 0 && time.Now().UnixNano()-f >= int64(r.load.lateAfter) {
			late = true
			r.lateReqs.Add(1)
		}
	}
	if r.load.slots > 0 {
		if r.active.Add(1) > r.load.slots {
			r.active.Add(-1)
			bodyPool.Put(buf)
			r.throttled.Add(1)
			if late {
				r.late429.Add(1)
			}
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		defer r.active.Add(-1)
	}
	if r.load.latency > 0 {
		time.Sleep(r.load.latency)
	}
	path := 0
	if p := req.URL.Path; len(p) == 3 && p[1] == 's' && p[2] >= '0' && p[2] <= '3' {
		path = int(p[2] - '0')
	}
	seen := r.seen[path]
	body := buf.Bytes()
	now := time.Now().UnixNano()
	var lats [128]int64
	lat := lats[:0]
	n := int64(0)
	for {
		i := bytes.Index(body, seqKey)
		if i < 0 {
			break
		}
		body = body[i+len(seqKey):]
		seq, ok := number(body)
		if !ok {
			r.unparsed.Add(1)
			continue
		}
		n++
		if seq >= 0 && int(seq/64) < len(seen) {
			bit := uint64(1) << (seq % 64)
			if seen[seq/64].Or(bit)&bit != 0 {
				r.dups.Add(1)
			}
		}
		if r.recordLat {
			if j := bytes.Index(body, wtsKey); j >= 0 {
				if wts, ok := number(body[j+len(wtsKey):]); ok && wts > 0 {
					lat = append(lat, now-wts)
				}
			}
		}
	}
	bodyPool.Put(buf)
	if n == 0 {
		r.unparsed.Add(1)
	}
	if len(lat) > 0 {
		r.latMu.Lock()
		r.lat = append(r.lat, lat...)
		r.latMu.Unlock()
	}
	r.first.CompareAndSwap(0, now)
	r.last.Store(now)
	c := r.count.Add(n)
	if r.target > 0 {
		if t := r.target / 10; c-n < t && c >= t {
			r.at10.Store(now)
		}
		if t := r.target * 9 / 10; c-n < t && c >= t {
			r.at90.Store(now)
		}
		if c >= r.target {
			r.doneOnce.Do(func() { close(r.done) })
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// window returns the time from the first to the newest envelope.
func (r *receiver) window() time.Duration {
	return time.Duration(r.last.Load() - r.first.Load())
}

// steadyRate returns the envelopes/s between 10% and 90% of the target,
// or 0 if 90% was not reached.
func (r *receiver) steadyRate() float64 {
	t10, t90 := r.at10.Load(), r.at90.Load()
	if t10 == 0 || t90 <= t10 {
		return 0
	}
	return float64(r.target*9/10-r.target/10) / time.Duration(t90-t10).Seconds()
}

// distinct returns the number of distinct seq values received on path p.
func (r *receiver) distinct(p int) int {
	n := 0
	for i := range r.seen[p] {
		n += bits.OnesCount64(r.seen[p][i].Load())
	}
	return n
}

// latStats are latency percentiles.
type latStats struct {
	n                   int
	p50, p99, p999, max time.Duration
}

func (r *receiver) latencies() *latStats {
	r.latMu.Lock()
	defer r.latMu.Unlock()
	if len(r.lat) == 0 {
		return nil
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(q * float64(len(s)-1))
		return time.Duration(s[i])
	}
	return &latStats{n: len(s), p50: at(0.50), p99: at(0.99), p999: at(0.999), max: time.Duration(s[len(s)-1])}
}
