package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/lease"
	"github.com/changegate/changegate/test/mongotest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

func testDB(t *testing.T) *mongo.Database { return mongotest.Database(t, "cgtest_lease_") }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// skewed is a local clock off by d from the real one.
func skewed(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }

// waitUntil polls cond until it holds or the test's deadline passes.
func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestAcquireRenewRelease(t *testing.T) {
	ctx := testCtx(t)
	db := testDB(t)
	const ttl = 400 * time.Millisecond
	s := lease.NewStore(db, "leases", ttl, lease.WithSafetyMargin(50*time.Millisecond))

	before := time.Now()
	a, ok, err := s.Acquire(ctx, "orders", "a")
	if err != nil || !ok {
		t.Fatalf("Acquire(a) = %v, %v", ok, err)
	}
	if a.Unit != "orders" || a.Owner != "a" || a.Epoch != 1 {
		t.Fatalf("lease = %+v", a)
	}
	if a.Deadline.Before(before.Add(ttl-50*time.Millisecond)) || a.Deadline.After(time.Now().Add(ttl-50*time.Millisecond)) || !a.Held(time.Now()) {
		t.Fatalf("deadline %v not start+ttl-margin", a.Deadline)
	}
	// b cannot take a live lease, nor renew it.
	if _, ok, err := s.Acquire(ctx, "orders", "b"); err != nil || ok {
		t.Fatalf("Acquire(b) on a live lease = %v, %v; want false, nil", ok, err)
	}
	if _, ok, err := s.Renew(ctx, lease.Lease{Unit: "orders", Owner: "b", Epoch: a.Epoch}); err != nil || ok {
		t.Fatalf("Renew by non-owner = %v, %v; want false, nil", ok, err)
	}
	// a renews, keeping the epoch.
	r, ok, err := s.Renew(ctx, a)
	if err != nil || !ok || r.Epoch != 1 || !r.Deadline.After(a.Deadline) || r.Expires.Before(a.Expires) {
		t.Fatalf("Renew = %+v, %v, %v", r, ok, err)
	}
	// Acquiring again (a restart under the same name) is a new tenure: the
	// epoch grows and the previous tenure can no longer renew.
	a2, ok, err := s.Acquire(ctx, "orders", "a")
	if err != nil || !ok || a2.Epoch != 2 {
		t.Fatalf("re-Acquire by the owner = %+v, %v, %v", a2, ok, err)
	}
	if _, ok, err := s.Renew(ctx, r); err != nil || ok {
		t.Fatalf("Renew of the previous tenure = %v, %v", ok, err)
	}
	// Release lets b acquire at once, with a new epoch.
	if ok, err := s.Release(ctx, "orders", "a", 2); err != nil || !ok {
		t.Fatalf("Release = %v, %v", ok, err)
	}
	b, ok, err := s.Acquire(ctx, "orders", "b")
	if err != nil || !ok || b.Epoch != 3 || b.Owner != "b" {
		t.Fatalf("Acquire(b) after release = %+v, %v, %v", b, ok, err)
	}
	// a's old tenure can be neither renewed nor released.
	if _, ok, err := s.Renew(ctx, a2); err != nil || ok {
		t.Fatalf("Renew of a released lease = %v, %v", ok, err)
	}
	if ok, err := s.Release(ctx, "orders", "a", 2); err != nil || ok {
		t.Fatalf("Release of a lost lease = %v, %v", ok, err)
	}
	// Expiry: b stops renewing; after the server's expiry a takes over
	// with epoch 4, and b's renewal fails.
	waitUntil(t, ctx, "b's lease to expire", func() bool {
		l, ok, err := s.Acquire(ctx, "orders", "a")
		if err != nil {
			t.Fatal(err)
		}
		if ok && l.Epoch != 4 {
			t.Fatalf("takeover epoch = %d, want 4", l.Epoch)
		}
		return ok
	})
	if _, ok, err := s.Renew(ctx, b); err != nil || ok {
		t.Fatalf("Renew of an expired, taken-over lease = %v, %v", ok, err)
	}
	// The owner of an expired lease that nobody took gets a new epoch too.
	l, _, _ := s.Acquire(ctx, "orders", "a")
	waitUntil(t, ctx, "a's lease to lapse", func() bool { return !l.Held(time.Now()) })
	time.Sleep(60 * time.Millisecond) // the server's expiry is up to the margin later
	l2, ok, err := s.Acquire(ctx, "orders", "a")
	if err != nil || !ok || l2.Epoch != l.Epoch+1 {
		t.Fatalf("re-Acquire after expiry = %+v, %v, %v; want epoch %d", l2, ok, err, l.Epoch+1)
	}

	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].Owner != "a" || list[0].Epoch != l2.Epoch || !list[0].Deadline.IsZero() {
		t.Fatalf("List = %+v, %v", list, err)
	}
}

// tenure is one owner's belief that it holds the unit, in real time.
type tenure struct {
	owner      string
	epoch      int64
	start, end time.Time
}

// TestNoTwoOwners runs owners with local clocks skewed by up to ±2 minutes
// (far more than the ttl) contending for one unit: acquiring, renewing,
// sometimes releasing, sometimes letting the lease lapse. Whenever an owner
// believes it holds the unit (Lease.Held by its own clock) it records the
// real time; no two owners' tenures may overlap, and epochs grow with
// every new tenure.
func TestNoTwoOwners(t *testing.T) {
	ctx := testCtx(t)
	db := testDB(t)
	const (
		owners = 6
		ttl    = 300 * time.Millisecond
		run    = 3 * time.Second
	)
	var (
		mu       sync.Mutex
		tenures  []tenure
		wg       sync.WaitGroup
		failures = make(chan error, owners)
	)
	stop := time.Now().Add(run)
	for i := range owners {
		skew := time.Duration(i-owners/2) * 40 * time.Second
		clock := skewed(skew)
		s := lease.NewStore(db, "leases", ttl, lease.WithSafetyMargin(50*time.Millisecond), lease.WithClock(clock))
		owner := fmt.Sprintf("o%d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(stop); n++ {
				l, ok, err := s.Acquire(ctx, "unit", owner)
				if err != nil {
					failures <- err
					return
				}
				if !ok {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				tn := tenure{owner: owner, epoch: l.Epoch, start: time.Now()}
				held := func() bool { // record the real time of every belief
					if l.Held(clock()) {
						tn.end = time.Now()
						return true
					}
					return false
				}
				for renewals := n % 3; ; renewals-- { // hold, renewing a few times
					until := time.Now().Add(ttl / 3)
					for time.Now().Before(until) && held() {
						time.Sleep(10 * time.Millisecond)
					}
					if !held() || renewals == 0 {
						break
					}
					nl, ok, err := s.Renew(ctx, l)
					if err != nil {
						failures <- err
						return
					}
					if !ok {
						break
					}
					l = nl
				}
				if held() {
					if n%2 == 0 { // release half of the time, else let it lapse
						if _, err := s.Release(ctx, "unit", owner, l.Epoch); err != nil {
							failures <- err
							return
						}
					} else {
						for held() {
							time.Sleep(10 * time.Millisecond)
						}
					}
				}
				mu.Lock()
				tenures = append(tenures, tn)
				mu.Unlock()
				// Give the others (polling every 5 ms) a turn: on a
				// loaded machine the owner that just let go would
				// otherwise win every race and the unit never move.
				time.Sleep(30 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Fatal(err)
	}
	if len(tenures) < owners {
		t.Fatalf("only %d tenures in %v", len(tenures), run)
	}
	byOwner := map[string]int{}
	for i, a := range tenures {
		byOwner[a.owner]++
		for _, b := range tenures[i+1:] {
			if a.epoch == b.epoch {
				t.Errorf("two tenures with epoch %d: %+v and %+v", a.epoch, a, b)
			}
			if a.owner != b.owner && !a.end.IsZero() && !b.end.IsZero() && a.start.Before(b.end) && b.start.Before(a.end) {
				t.Errorf("overlapping tenures: %s epoch %d [%v, %v] and %s epoch %d [%v, %v]",
					a.owner, a.epoch, a.start.Format("15:04:05.000"), a.end.Format("15:04:05.000"),
					b.owner, b.epoch, b.start.Format("15:04:05.000"), b.end.Format("15:04:05.000"))
			}
			// A later tenure (in real time) has a larger epoch.
			if !a.end.IsZero() && !b.end.IsZero() && (a.end.Before(b.start) && a.epoch > b.epoch || b.end.Before(a.start) && b.epoch > a.epoch) {
				t.Errorf("epoch went backwards: %+v then %+v", a, b)
			}
		}
	}
	if len(byOwner) < 2 {
		t.Errorf("tenures by owner = %v, want the unit to change hands", byOwner)
	}
}

// TestExpiredOwnerIsFenced: owner a saves a checkpoint, is paused past its
// lease, b takes over, claims the checkpoint and loads it; a wakes up and
// saves a later position: refused with ErrFenced, and the checkpoint is
// b's.
func TestExpiredOwnerIsFenced(t *testing.T) {
	ctx := testCtx(t)
	db := testDB(t)
	const ttl = 300 * time.Millisecond
	leases := lease.NewStore(db, "leases", ttl, lease.WithSafetyMargin(50*time.Millisecond))
	cps := checkpoint.NewStore(db, "checkpoints")
	tok := func(data string) bson.Raw {
		b, _ := bson.Marshal(bson.D{{Key: "_data", Value: data}})
		return b
	}

	a, ok, err := leases.Acquire(ctx, "orders", "a")
	if err != nil || !ok {
		t.Fatalf("Acquire(a) = %v, %v", ok, err)
	}
	if err := cps.Fence(ctx, "orders", a.Epoch); err != nil {
		t.Fatal(err)
	}
	if err := cps.Save(ctx, checkpoint.Checkpoint{Source: "orders", Token: tok("8200000100"), Epoch: a.Epoch}); err != nil {
		t.Fatal(err)
	}
	// a is "paused": it neither renews nor stops. b takes over after expiry.
	var b lease.Lease
	waitUntil(t, ctx, "b to take over", func() bool {
		var err error
		b, ok, err = leases.Acquire(ctx, "orders", "b")
		if err != nil {
			t.Fatal(err)
		}
		return ok
	})
	if b.Epoch <= a.Epoch {
		t.Fatalf("takeover epoch %d not above %d", b.Epoch, a.Epoch)
	}
	if err := cps.Fence(ctx, "orders", b.Epoch); err != nil {
		t.Fatal(err)
	}
	start, ok, err := cps.Load(ctx, "orders")
	if err != nil || !ok {
		t.Fatalf("Load = %v, %v", ok, err)
	}
	// a wakes up and writes a position past b's start.
	err = cps.Save(ctx, checkpoint.Checkpoint{Source: "orders", Token: tok("8200000200"), Epoch: a.Epoch})
	if !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("stale owner's save = %v, want ErrFenced", err)
	}
	got, _, _ := cps.Load(ctx, "orders")
	if string(got.Token) != string(start.Token) || got.Epoch != b.Epoch {
		t.Fatalf("checkpoint after the refused write = %v epoch %d, want %v epoch %d", got.Token, got.Epoch, start.Token, b.Epoch)
	}
	// b moves on.
	if err := cps.Save(ctx, checkpoint.Checkpoint{Source: "orders", Token: tok("8200000300"), Epoch: b.Epoch}); err != nil {
		t.Fatal(err)
	}
	// a's lease is gone for good.
	if _, ok, err := leases.Renew(ctx, a); err != nil || ok {
		t.Fatalf("Renew(a) = %v, %v", ok, err)
	}
}
