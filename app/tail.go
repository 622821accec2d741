package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/router"
	"github.com/changegate/changegate/source"
)

// TailOptions configure Tail.
type TailOptions struct {
	// Source names the [[sources]] entry to read (required).
	Source string
	// Rule, when set, keeps only the changes this rule (of Source) matches;
	// otherwise every change some rule of Source matches is printed.
	Rule string
	// Limit stops Tail after this many changes were printed; 0: until ctx
	// ends.
	Limit int
	// ResumeAfter starts the stream after this resume token; StartAt at
	// this cluster time; neither: from now (the source's start_at is not
	// used).
	ResumeAfter bson.Raw
	StartAt     time.Time
	// Logger receives the source's log lines; nil discards.
	Logger *slog.Logger
	// Print is called with every matched change and the rules that match
	// it, one at a time, from one goroutine. An error stops Tail and is
	// returned.
	Print func(ev *event.Event, rules []string) error
	// Opened, when set, is called once, when the change stream is first
	// open: changes made from then on are seen.
	Opened func()
}

// Tail reads one source's change stream the way Run does — the same
// source.Source, so the same pipeline (the rules' pushed-down $match, the
// source's stages, $changeStreamSplitLargeEvent and the reassembly of
// split events), reopening after errors — and prints the changes its rules
// match with opts.Print, routed by the same compiled rules. It is
// read-only: nothing is delivered or dead-lettered, no checkpoint is read
// or written and no lease is taken, so it can run beside the replicas of a
// running gateway without disturbing them. It reads the whole source, not
// one partition. It returns nil when ctx ends or after opts.Limit changes,
// and an error when the source fails (lost history, an oversize change
// with on_oversize_event = "fail").
func Tail(ctx context.Context, cfg *config.Config, opts TailOptions) error {
	sc := cfg.Source(opts.Source)
	if sc == nil {
		return fmt.Errorf("no source %q", opts.Source)
	}
	if opts.Rule != "" {
		i := slices.IndexFunc(cfg.Rules, func(r config.Rule) bool { return r.Name == opts.Rule })
		if i < 0 {
			return fmt.Errorf("no rule %q", opts.Rule)
		}
		if cfg.Rules[i].Source != sc.Name {
			return fmt.Errorf("rule %q reads source %q, not %q", opts.Rule, cfg.Rules[i].Source, sc.Name)
		}
	}
	if opts.Print == nil {
		return errors.New("tail: no Print function")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rules, err := CompileRules(cfg)
	if err != nil {
		return err
	}
	var spec source.Spec
	for _, d := range unitDefs(cfg) {
		if d.source == sc.Name {
			spec = d.spec
			break
		}
	}
	// The whole source in one stream, from now (or where asked).
	spec.Unit, spec.Partition, spec.Partitions = sc.Name, 0, 1
	spec.StartAt = opts.StartAt
	spec.Pushdown, _ = rules.Pushdown(sc.Name)
	// tail prints changes only: never an initial snapshot (its checkpoint
	// store holds nothing, so a source with snapshot = "initial" would
	// otherwise scan every document first).
	spec.Snapshot = source.SnapshotNever
	// Changes are admitted against the byte budget as in the gateway; the
	// dispatcher prints and acknowledges each at once.
	sizing, err := MemorySizing(cfg)
	if err != nil {
		return err
	}
	spec.Budget = memory.NewBudget(sizing.Budget, log, nil)

	client, err := Connect(cfg)
	if err != nil {
		return err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(dctx)
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Opened is reported by the watcher below, or before the first change
	// if that comes first.
	var openOnce sync.Once
	opened := func() {
		if opts.Opened != nil {
			openOnce.Do(opts.Opened)
		}
	}
	out := &tailDispatcher{rules: rules, rule: opts.Rule, print: opts.Print, limit: opts.Limit, done: make(chan struct{}), opened: opened}
	src := source.New(spec, client, tailPosition{token: opts.ResumeAfter}, tailGaps{log: log}, out, nil, log)

	// The watcher reports the stream's first opening, and stops Tail when
	// the limit is reached or the source fails for good (it then waits
	// for ctx rather than returning).
	var failed error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-out.done:
				cancel()
				return
			case <-tick.C:
			}
			st := src.Status()
			if st.State == source.StateOpen {
				opened()
			}
			if st.State == source.StateFailed {
				failed = errors.New(st.LastError)
				cancel()
				return
			}
		}
	}()
	err = src.Run(ctx)
	cancel()
	wg.Wait()
	switch {
	case err != nil:
		return err
	case out.err != nil:
		return out.err
	}
	return failed
}

// tailDispatcher routes what the source reads with the compiled rules and
// prints what matches; every change is acknowledged at once. Dispatch is
// called from the source's reading goroutine only.
type tailDispatcher struct {
	rules  *router.Rules
	rule   string
	print  func(*event.Event, []string) error
	limit  int
	n      int
	err    error
	done   chan struct{} // closed when the limit is reached or print failed
	opened func()        // reports the stream open (once)
}

func (t *tailDispatcher) Dispatch(ev *event.Event, ack func()) {
	defer ack()
	t.opened()
	if t.err != nil || (t.limit > 0 && t.n >= t.limit) {
		return // stopping: the rest of the batch is not printed
	}
	m := t.rules.Route(ev)
	if len(m.Rules) == 0 || (t.rule != "" && !slices.Contains(m.Rules, t.rule)) {
		return
	}
	if err := t.print(ev, m.Rules); err != nil {
		t.err = err
		close(t.done)
		return
	}
	if t.n++; t.limit > 0 && t.n == t.limit {
		close(t.done)
	}
}

// tailPosition is tail's checkpoint store: it starts from the given token
// (or has no checkpoint) and writes nothing.
type tailPosition struct{ token bson.Raw }

func (p tailPosition) Load(_ context.Context, unit string) (checkpoint.Checkpoint, bool, error) {
	if p.token == nil {
		return checkpoint.Checkpoint{}, false, nil
	}
	ct, _ := event.TokenClusterTime(p.token)
	return checkpoint.Checkpoint{Source: unit, Token: p.token, ClusterTime: ct}, true, nil
}

func (tailPosition) Save(context.Context, checkpoint.Checkpoint) error { return nil }

func (tailPosition) List(context.Context) ([]checkpoint.Checkpoint, error) { return nil, nil }

// tailGaps logs the gaps (lost history with on_history_lost =
// "resume_from_now", a skipped oversize change) Run would record in the
// dead-letter collection, without writing them.
type tailGaps struct{ log *slog.Logger }

func (g tailGaps) Put(_ context.Context, e deadletter.Entry) error {
	g.log.Warn("tail: changes skipped (run would record this gap in the dead-letter collection; tail writes nothing)",
		"reason", e.Reason, "from", e.GapFrom, "to", e.GapTo)
	return nil
}
