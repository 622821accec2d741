package subscription_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/changegate/changegate/subscription"
)

// A deletion schedules the removal of what the subscription parked or
// dead-lettered after delete_grace, in its transaction; RunPurges removes
// it once due, except for a name taken again meanwhile (re-created, or a
// sink of the file), and each purge is done once.
func TestDeleteSchedulesThePurgeAfterTheGrace(t *testing.T) {
	f := newFixture(t, true)
	s := subscription.NewStore(f.db, subscription.Options{Sealer: f.store.Sealer(), Now: f.clock.now, DeleteGrace: func() time.Duration { return time.Hour },
		Log: slog.New(slog.DiscardHandler)})
	ctx := f.ctx
	for _, name := range []string{"team-a-1", "team-a-2", "team-a-3"} {
		if _, _, err := s.Create(ctx, "admin", name, spec(name, "https://a.example.com/"), 10); err != nil {
			t.Fatal(err)
		}
		p, err := s.Delete(ctx, "admin", name, 0)
		if err != nil {
			t.Fatal(err)
		}
		if p.Sink != name || !p.PurgeAt.Equal(f.clock.now().Add(time.Hour)) {
			t.Fatalf("purge %+v, want %s at now + 1h", p, name)
		}
	}
	// team-a-2 is created again; team-a-3's name is taken by the file.
	if _, _, err := s.Create(ctx, "admin", "team-a-2", spec("team-a-2", "https://a.example.com/"), 10); err != nil {
		t.Fatal(err)
	}
	if due, err := s.DuePurges(ctx, f.clock.now()); err != nil || len(due) != 0 {
		t.Fatalf("due before the grace: %v %v", due, err)
	}
	audit, err := s.Audit(ctx, "team-a-1", 1)
	if err != nil || len(audit) != 1 || audit[0].Action != subscription.ActionDelete || audit[0].Detail == "" {
		t.Fatalf("audit of the delete: %+v %v", audit, err)
	}

	f.clock.add(time.Hour + time.Second)
	var (
		mu     sync.Mutex
		purged []string
	)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.RunPurges(rctx, 10*time.Millisecond, func(_ context.Context, sink string) (int64, error) {
			mu.Lock()
			defer mu.Unlock()
			purged = append(purged, sink)
			return 2, nil
		}, func(name string) bool { return name == "team-a-3" }, slog.New(slog.DiscardHandler))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		due, err := s.DuePurges(ctx, f.clock.now())
		if err == nil && len(due) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("purges still due: %+v %v", due, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a few more runs: nothing is purged twice
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(purged, []string{"team-a-1"}) {
		t.Fatalf("purged %v, want only team-a-1 (team-a-2 re-created, team-a-3 the file's)", purged)
	}
}
