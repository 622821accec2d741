package observe

import (
	"context"

	"github.com/changegate/changegate/event"
)

// Fanout returns an Observer that calls each of obs in turn (nil ones are
// left out): nil when none is left, the observer itself when one is. Each
// gets the context the one before it returned from AttemptStart.
func Fanout(obs ...Observer) Observer {
	var f fanout
	var hooks []Hooks
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case *fanout:
			f.obs = append(f.obs, o.obs...)
		case *hookedFanout:
			f.obs = append(f.obs, o.obs...)
			hooks = append(hooks, o.hooks...)
		default:
			f.obs = append(f.obs, o)
			if h, ok := o.(Hooks); ok {
				hooks = append(hooks, h)
			}
		}
	}
	switch {
	case len(f.obs) == 0:
		return nil
	case len(f.obs) == 1:
		return f.obs[0]
	case len(hooks) == 0:
		return &f // no Hooks: the router calls none
	}
	return &hookedFanout{fanout: f, hooks: hooks}
}

type fanout struct{ obs []Observer }

// hookedFanout is a fanout some of whose observers have Hooks.
type hookedFanout struct {
	fanout
	hooks []Hooks
}

func (f *hookedFanout) BeforeDispatch(ev *event.Event) {
	for _, h := range f.hooks {
		h.BeforeDispatch(ev)
	}
}

func (f *hookedFanout) AfterDispatch(ev *event.Event) {
	for _, h := range f.hooks {
		h.AfterDispatch(ev)
	}
}

func (f *fanout) Dispatched(d Dispatch) {
	for _, o := range f.obs {
		o.Dispatched(d)
	}
}

func (f *fanout) AttemptStart(ctx context.Context, a Attempt) context.Context {
	for _, o := range f.obs {
		ctx = o.AttemptStart(ctx, a)
	}
	return ctx
}

func (f *fanout) AttemptEnd(ctx context.Context, a Attempt) {
	for _, o := range f.obs {
		o.AttemptEnd(ctx, a)
	}
}

func (f *fanout) Outcome(o Outcome) {
	for _, ob := range f.obs {
		ob.Outcome(o)
	}
}
