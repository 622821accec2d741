package checkpoint

import (
	"context"
	"fmt"
	"math/rand"
	"runtime"
	"sync"
	"testing"
	"time"
	"weak"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func tok(i int) bson.Raw {
	b, _ := bson.Marshal(bson.D{{Key: "_data", Value: i}})
	return b
}

func tokNum(t *testing.T, r bson.Raw) int {
	t.Helper()
	if r == nil {
		return -1
	}
	return int(r.Lookup("_data").Int32())
}

func TestTrackerWatermarkIsContiguous(t *testing.T) {
	tr := NewTracker(10, Position{})
	ctx := context.Background()
	for i := 0; i < 5; i++ {
		if _, err := tr.Add(ctx, tok(i), bson.Timestamp{T: uint32(i + 1)}, time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		ack  uint64
		want int
	}{
		{2, -1}, {1, -1}, {0, 2}, {4, 2}, {3, 4},
	}
	for _, s := range steps {
		tr.Ack(s.ack)
		p, _ := tr.Position()
		if got := tokNum(t, p.Token); got != s.want {
			t.Fatalf("after ack %d: watermark %d, want %d", s.ack, got, s.want)
		}
	}
	if p, _ := tr.Position(); p.ClusterTime.T != 5 {
		t.Fatalf("cluster time %v, want T=5", p.ClusterTime)
	}
}

func TestTrackerResumePointWaitsForEarlierEvents(t *testing.T) {
	tr := NewTracker(10, Position{Token: tok(100)})
	ctx := context.Background()
	tr.SetResumePoint(tok(101)) // nothing in flight: applies at once
	if p, _ := tr.Position(); tokNum(t, p.Token) != 101 {
		t.Fatalf("idle resume point not applied: %d", tokNum(t, p.Token))
	}
	s0, _ := tr.Add(ctx, tok(102), bson.Timestamp{}, time.Time{})
	tr.SetResumePoint(tok(103))
	if p, _ := tr.Position(); tokNum(t, p.Token) != 101 {
		t.Fatalf("resume point applied before the event in flight was acked: %d", tokNum(t, p.Token))
	}
	tr.Ack(s0)
	if p, _ := tr.Position(); tokNum(t, p.Token) != 103 {
		t.Fatalf("resume point not applied after ack: %d", tokNum(t, p.Token))
	}
}

func TestTrackerBackpressure(t *testing.T) {
	tr := NewTracker(2, Position{})
	ctx := context.Background()
	tr.Add(ctx, tok(0), bson.Timestamp{}, time.Time{})
	tr.Add(ctx, tok(1), bson.Timestamp{}, time.Time{})
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := tr.Add(short, tok(2), bson.Timestamp{}, time.Time{}); err == nil {
		t.Fatal("Add beyond the cap did not block")
	}
	done := make(chan uint64)
	go func() {
		s, _ := tr.Add(ctx, tok(2), bson.Timestamp{}, time.Time{})
		done <- s
	}()
	tr.Ack(1) // out of order: one event fewer in flight
	select {
	case s := <-done:
		if s != 2 {
			t.Fatalf("seq %d, want 2", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Add still blocked after an ack")
	}
	if n := tr.InFlight(); n != 2 {
		t.Fatalf("InFlight %d, want 2 (events 0 and 2)", n)
	}
}

// TestTrackerSpanBehindSlowEvent: behind one slow event, Add goes on while
// the later events are acknowledged, up to spanFactor times the cap of
// events the watermark has not passed; then it waits for the slow one.
func TestTrackerSpanBehindSlowEvent(t *testing.T) {
	const max = 3
	tr := NewTracker(max, Position{})
	ctx := context.Background()
	slow, _ := tr.Add(ctx, tok(0), bson.Timestamp{}, time.Time{})
	for i := 1; i < spanFactor*max; i++ {
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		seq, err := tr.Add(short, tok(i), bson.Timestamp{}, time.Time{})
		cancel()
		if err != nil {
			t.Fatalf("event %d behind the slow one: Add blocked with %d in flight", i, tr.InFlight())
		}
		tr.Ack(seq)
	}
	if n := tr.InFlight(); n != 1 {
		t.Fatalf("InFlight %d, want 1", n)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := tr.Add(short, tok(99), bson.Timestamp{}, time.Time{}); err == nil {
		t.Fatalf("Add went past %d events behind the watermark", spanFactor*max)
	}
	if p, _ := tr.Position(); p.Token != nil {
		t.Fatalf("watermark moved past the slow event: %d", tokNum(t, p.Token))
	}
	tr.Ack(slow)
	if p, _ := tr.Position(); tokNum(t, p.Token) != spanFactor*max-1 {
		t.Fatalf("watermark %d, want %d", tokNum(t, p.Token), spanFactor*max-1)
	}
	if _, err := tr.Add(ctx, tok(100), bson.Timestamp{}, time.Time{}); err != nil {
		t.Fatal(err)
	}
}

func TestTrackerConcurrentAcksNeverSkip(t *testing.T) {
	const n = 20000
	tr := NewTracker(64, Position{})
	ctx := context.Background()
	acks := make(chan uint64, 64)
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range acks {
				if rand.Intn(4) == 0 {
					time.Sleep(time.Microsecond)
				}
				tr.Ack(s)
			}
		}()
	}
	for i := 0; i < n; i++ {
		s, err := tr.Add(ctx, tok(i), bson.Timestamp{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		// The watermark may never pass an event that is not acked yet.
		p, _ := tr.Position()
		if got := tokNum(t, p.Token); got >= i {
			t.Fatalf("watermark %d passed the in-flight event %d", got, i)
		}
		acks <- s
	}
	close(acks)
	wg.Wait()
	<-tr.Drained()
	if p, _ := tr.Position(); tokNum(t, p.Token) != n-1 {
		t.Fatalf("final watermark %d, want %d", tokNum(t, p.Token), n-1)
	}
}

func BenchmarkTrackerAddAck(b *testing.B) {
	tr := NewTracker(1024, Position{})
	ctx := context.Background()
	t0 := tok(1)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s, _ := tr.Add(ctx, t0, bson.Timestamp{}, time.Time{})
		tr.Ack(s)
	}
}

// A post-batch token carries its cluster time into the position, so a quiet
// stream's checkpoint time advances with it.
func TestTrackerResumePointTime(t *testing.T) {
	tr := NewTracker(10, Position{ClusterTime: bson.Timestamp{T: 100}})
	pbrt, _ := bson.Marshal(bson.D{{Key: "_data", Value: "82000000C8000000012B0229296E04"}}) // T=200, I=1
	tr.SetResumePoint(pbrt)
	p, _ := tr.Position()
	if p.ClusterTime != (bson.Timestamp{T: 200, I: 1}) || !p.WallTime.Equal(time.Unix(200, 0)) {
		t.Fatalf("position %+v, want cluster time 200/1", p)
	}
}

// AddBeside admits past the cap while no more than its own events are in
// flight (what grouped sinks keep of an open transaction), keeps the
// watermark contiguous across the growth, waits otherwise, and Add still
// waits until the events in flight are below the cap.
func TestTrackerAddBesideGrows(t *testing.T) {
	tr := NewTracker(3, Position{})
	ctx := context.Background()
	var seqs []uint64
	for i := range 2 {
		s, err := tr.Add(ctx, tok(i), bson.Timestamp{T: uint32(i + 1)}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	for i := 2; i < 10; i++ {
		s, err := tr.AddBeside(ctx, tok(i), bson.Timestamp{T: uint32(i + 1)}, time.Time{}, i)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	{
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, err := tr.AddBeside(short, tok(98), bson.Timestamp{T: 98}, time.Time{}, 9)
		cancel()
		if err == nil {
			t.Fatal("AddBeside admitted with more events in flight than its own")
		}
	}
	if n := tr.InFlight(); n != 10 {
		t.Fatalf("in flight %d, want 10", n)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := tr.Add(short, tok(99), bson.Timestamp{T: 99}, time.Time{}); err == nil {
		t.Fatal("Add admitted over the cap")
	}
	for i := 9; i >= 1; i-- {
		tr.Ack(seqs[i])
	}
	if p, _ := tr.Position(); p.Token != nil {
		t.Fatalf("watermark %d before the first ack", tokNum(t, p.Token))
	}
	tr.Ack(seqs[0])
	if p, _ := tr.Position(); tokNum(t, p.Token) != 9 {
		t.Fatalf("watermark %d, want 9", tokNum(t, p.Token))
	}
	if _, err := tr.Add(ctx, tok(10), bson.Timestamp{T: 11}, time.Time{}); err != nil {
		t.Fatal(err)
	}
}

// Drained is closed once everything in flight is acked, each time the
// tracker empties, and not before; a tracker with nothing in flight is
// drained at once. The ring (a power of two above a cap that is not one)
// keeps the watermark through many wraps.
func TestTrackerDrainedEachTime(t *testing.T) {
	tr := NewTracker(5, Position{})
	ctx := context.Background()
	closed := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	if !closed(tr.Drained()) {
		t.Fatal("an empty tracker is not drained")
	}
	for round := 0; round < 20; round++ {
		var seqs []uint64
		for i := 0; i < 5; i++ {
			s, err := tr.Add(ctx, tok(round*5+i), bson.Timestamp{}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, s)
		}
		d := tr.Drained()
		for i := len(seqs) - 1; i >= 0; i-- {
			if closed(d) {
				t.Fatalf("round %d: drained with %d events in flight", round, i+1)
			}
			tr.Ack(seqs[i])
		}
		if !closed(d) || !closed(tr.Drained()) {
			t.Fatalf("round %d: not drained after every ack", round)
		}
		if p, _ := tr.Position(); tokNum(t, p.Token) != round*5+4 {
			t.Fatalf("round %d: watermark %d, want %d", round, tokNum(t, p.Token), round*5+4)
		}
	}
}

// TestTrackerAckedOutOfOrderFreesTheChange checks that an event acked while
// an earlier one is still in flight does not keep its change in memory: the
// token the tracker holds until the watermark passes it is a slice of the
// whole change the source read, which the byte budget no longer counts once
// the event is acked. Behind one slow event, every acked change stayed in
// memory (up to max_in_flight_events of them: with 1 MiB documents, 10 GiB
// at the default), and the token still reaches the checkpoint intact.
func TestTrackerAckedOutOfOrderFreesTheChange(t *testing.T) {
	tr := NewTracker(10, Position{})
	ctx := context.Background()
	if _, err := tr.Add(ctx, tok(0), bson.Timestamp{T: 1}, time.Time{}); err != nil {
		t.Fatal(err) // the slow event
	}
	const n = 4
	freed := make([]weak.Pointer[[1 << 20]byte], n)
	for i := range n {
		change := new([1 << 20]byte) // a 1 MiB change; its token is the first bytes
		copy(change[:], tok(i+1))
		freed[i] = weak.Make(change)
		seq, err := tr.Add(ctx, bson.Raw(change[:len(tok(i+1))]), bson.Timestamp{T: uint32(i + 2)}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		tr.Ack(seq)
	}
	runtime.GC()
	runtime.GC()
	for i, w := range freed {
		if w.Value() != nil {
			t.Errorf("change %d, acked behind a slow event, is still in memory", i+1)
		}
	}
	tr.Ack(0)
	if p, _ := tr.Position(); tokNum(t, p.Token) != n {
		t.Fatalf("watermark %d, want %d", tokNum(t, p.Token), n)
	}
}

// TestTrackerWatermarkFreesTheChange: an event acked in order becomes the
// watermark, which the saver reads and keeps (and, behind a slow event, the
// tracker keeps too); what they keep is a copy of its token, not the slice
// of its change.
func TestTrackerWatermarkFreesTheChange(t *testing.T) {
	tr := NewTracker(10, Position{})
	change := new([1 << 20]byte) // a 1 MiB change; its token is the first bytes
	copy(change[:], tok(1))
	freed := weak.Make(change)
	seq, err := tr.Add(context.Background(), bson.Raw(change[:len(tok(1))]), bson.Timestamp{T: 1}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	tr.Ack(seq)
	change = nil
	saved, _ := tr.Position() // as the saver does
	runtime.GC()
	runtime.GC()
	if freed.Value() != nil {
		t.Error("the change of the watermark's event is still in memory")
	}
	if tokNum(t, saved.Token) != 1 {
		t.Fatalf("watermark %d, want 1", tokNum(t, saved.Token))
	}
	if p, _ := tr.Position(); tokNum(t, p.Token) != 1 {
		t.Fatalf("watermark %d, want 1", tokNum(t, p.Token))
	}
}

// TestTrackerResumePointFreesTheReply: a post-batch resume token is a slice
// of the driver's reply, the whole batch of changes; the tracker keeps a
// copy of it, so the reply goes once the driver drops it.
func TestTrackerResumePointFreesTheReply(t *testing.T) {
	for _, inFlight := range []bool{false, true} {
		t.Run(fmt.Sprintf("in flight %v", inFlight), func(t *testing.T) {
			tr := NewTracker(10, Position{})
			var seq uint64
			if inFlight {
				var err error
				if seq, err = tr.Add(context.Background(), tok(1), bson.Timestamp{T: 1}, time.Time{}); err != nil {
					t.Fatal(err)
				}
			}
			reply := new([1 << 20]byte) // the batch, then the token
			at := len(reply) - len(tok(2)) - 64
			copy(reply[at:], tok(2))
			freed := weak.Make(reply)
			tr.SetResumePoint(bson.Raw(reply[at : at+len(tok(2))]))
			reply = nil
			runtime.GC()
			runtime.GC()
			if freed.Value() != nil {
				t.Error("the reply of the resume point is still in memory")
			}
			if inFlight {
				tr.Ack(seq)
			}
			saved, _ := tr.Position()
			if tokNum(t, saved.Token) != 2 {
				t.Fatalf("watermark %d, want 2", tokNum(t, saved.Token))
			}
		})
	}
}
