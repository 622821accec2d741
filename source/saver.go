package source

import (
	"context"
	"sync"
	"time"

	"github.com/changegate/changegate/checkpoint"
)

// saver persists a tracker's watermark at most every CheckpointInterval and
// whenever asked.
type saver struct {
	s       *Source
	tr      *checkpoint.Tracker
	mu      sync.Mutex // serialises saves
	version uint64
	saved   checkpoint.Position
}

func newSaver(s *Source, tr *checkpoint.Tracker, start checkpoint.Position) *saver {
	_, v := tr.Position()
	return &saver{s: s, tr: tr, version: v, saved: start}
}

func (sv *saver) loop(ctx context.Context) {
	t := time.NewTicker(sv.s.spec.CheckpointInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := sv.save(ctx); err != nil && ctx.Err() == nil {
			if isFenced(err) {
				sv.s.leaseLost(err)
				return
			}
			sv.s.log.Warn("cannot persist checkpoint; will retry", "err", err)
		}
	}
}

// save persists the watermark if it moved since the last save.
func (sv *saver) save(ctx context.Context) error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	pos, v := sv.tr.Position()
	if v == sv.version || pos.Token == nil {
		return nil
	}
	if sv.s.abandoned() || !sv.s.spec.Tenure.Held() {
		return nil // the lease is lost: the next owner saves from here on
	}
	now := time.Now().UTC()
	var epoch int64
	if t := sv.s.spec.Tenure; t != nil {
		epoch = t.Epoch
	}
	err := sv.s.cps.Save(ctx, checkpoint.Checkpoint{
		Source: sv.s.spec.Unit, Token: pos.Token, ClusterTime: pos.ClusterTime,
		WallTime: pos.WallTime, UpdatedAt: now, Epoch: epoch,
	})
	if err != nil {
		return err
	}
	sv.version = v
	sv.saved = pos
	sv.s.mSaves.Inc()
	sv.s.mu.Lock()
	sv.s.status.Checkpoint = pos
	sv.s.status.CheckpointSave = now
	last := sv.s.status.LastEvent
	sv.s.mu.Unlock()
	if !last.IsZero() && !pos.WallTime.IsZero() {
		sv.s.mLag.Set(max(0, last.Sub(pos.WallTime).Seconds()))
	} else {
		sv.s.mLag.Set(0)
	}
	return nil
}
