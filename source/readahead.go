package source

import (
	"context"

	"github.com/changegate/changegate/checkpoint"
)

// ReadAheader is a Dispatcher that bounds how far a source reads ahead of
// the deliveries (the router's Engine): the Source's trackers wait for
// ReadAhead(name) before every event they admit (checkpoint.Tracker.SetGate).
type ReadAheader interface {
	ReadAhead(source string) func(context.Context) error
}

// newTracker returns the tracker of a stream or a snapshot scan, with the
// dispatcher's read-ahead bound.
func (s *Source) newTracker(start checkpoint.Position) *checkpoint.Tracker {
	tr := checkpoint.NewTracker(s.spec.MaxInFlight, start)
	if ra, ok := s.out.(ReadAheader); ok {
		tr.SetGate(ra.ReadAhead(s.spec.Name))
	}
	return tr
}
