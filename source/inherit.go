package source

import (
	"context"
	"strings"

	"github.com/changegate/changegate/checkpoint"
)

// loadOrInherit loads the unit's checkpoint; a unit without one inherits
// the oldest checkpoint of its source's previous partitioning (see
// Inherit), so that changing partitions loses nothing.
func (s *Source) loadOrInherit(ctx context.Context) (checkpoint.Checkpoint, bool, error) {
	cp, found, err := s.cps.Load(ctx, s.spec.Unit)
	if err != nil || found {
		return cp, found, err
	}
	all, err := s.cps.List(ctx)
	if err != nil {
		return cp, false, err
	}
	from, ok := Inherit(all, s.spec.Name, s.spec.Partitions)
	if !ok {
		return cp, false, nil
	}
	s.log.Warn("no checkpoint for this unit: starting from the oldest checkpoint of the source's previous partitioning (changes after it may be delivered again)",
		"from_unit", from.Source, "cluster_time", from.ClusterTime, "saved_at", from.UpdatedAt)
	from.Source = s.spec.Unit
	from.Epoch = 0
	if from.Snapshot != nil {
		// The previous partitioning's unit delivered only its own share of
		// the documents up to its progress: this unit scans from the start.
		from.Snapshot = &checkpoint.Snapshot{ID: from.Snapshot.ID}
	}
	return from, true, nil
}

// Inherit chooses the checkpoint a unit of source without one starts from,
// when the source now has n partitions: among the checkpoints of the
// source's units under another partitioning (the source's own name for an
// unpartitioned source, "<source>#<i>/<m>" with m != n), the layout saved
// most recently, and in it the oldest checkpoint (the smallest position),
// so that every change of the unit's documents after it is read again
// (duplicates possible, nothing lost). Checkpoints of the same partitioning
// cover other documents only and are never inherited. It returns false
// when there is nothing to inherit.
func Inherit(cps []checkpoint.Checkpoint, source string, n int) (checkpoint.Checkpoint, bool) {
	type layout struct {
		newest int // index of the most recently saved checkpoint
		oldest int // index of the smallest position
	}
	layouts := map[int]*layout{}
	for i, cp := range cps {
		src, _, m, ok := ParseUnit(cp.Source)
		if !ok || src != source || m == max(n, 1) || len(cp.Token) == 0 {
			continue
		}
		l := layouts[m]
		if l == nil {
			layouts[m] = &layout{newest: i, oldest: i}
			continue
		}
		if cp.UpdatedAt.After(cps[l.newest].UpdatedAt) {
			l.newest = i
		}
		if before(cp, cps[l.oldest]) {
			l.oldest = i
		}
	}
	var best *layout
	for _, l := range layouts {
		if best == nil || cps[l.newest].UpdatedAt.After(cps[best.newest].UpdatedAt) {
			best = l
		}
	}
	if best == nil {
		return checkpoint.Checkpoint{}, false
	}
	return cps[best.oldest], true
}

// before orders checkpoints of one namespace by position: by the tokens'
// _data (hex KeyStrings that sort in stream order and begin with the
// cluster time), else by cluster time.
func before(a, b checkpoint.Checkpoint) bool {
	da, _ := a.Token.Lookup("_data").StringValueOK()
	db, _ := b.Token.Lookup("_data").StringValueOK()
	if da != "" && db != "" {
		return strings.Compare(da, db) < 0
	}
	return a.ClusterTime.Before(b.ClusterTime)
}
