package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/changegate/changegate/checkpoint"
	"github.com/changegate/changegate/test/mongotest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// testDB returns a fresh database for one test (see package mongotest: a
// real MongoDB with CHANGEGATE_TEST_MONGODB_URI, otherwise test/mongowire).
func testDB(t *testing.T) *mongo.Database {
	return mongotest.Database(t, "cgtest_checkpoint_")
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func token(t *testing.T, data string) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(bson.D{{Key: "_data", Value: data}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestStoreSaveLoad(t *testing.T) {
	ctx := testCtx(t)
	s := checkpoint.NewStore(testDB(t), "checkpoints")

	if _, ok, err := s.Load(ctx, "orders"); err != nil || ok {
		t.Fatalf("Load before Save = %v, %v; want false, nil", ok, err)
	}

	wall := time.Date(2026, 11, 22, 10, 0, 0, 123_000_000, time.FixedZone("x", 3600))
	want := checkpoint.Checkpoint{
		Source:      "orders",
		Token:       token(t, "8264F1A2B3000000012B022C0100296E5A1004"),
		ClusterTime: bson.Timestamp{T: 1795000000, I: 7},
		WallTime:    wall,
		UpdatedAt:   wall.Add(time.Second),
	}
	if err := s.Save(ctx, want); err != nil {
		t.Fatalf("Save: %v", err)
	}
	got, ok, err := s.Load(ctx, "orders")
	if err != nil || !ok {
		t.Fatalf("Load = %v, %v; want true, nil", ok, err)
	}
	if !bytes.Equal(got.Token, want.Token) {
		t.Errorf("Token = %s, want %s", got.Token, want.Token)
	}
	if got.Source != "orders" || got.ClusterTime != want.ClusterTime {
		t.Errorf("Load = %+v, want %+v", got, want)
	}
	if !got.WallTime.Equal(wall) || got.WallTime.Location() != time.UTC {
		t.Errorf("WallTime = %v, want %v in UTC", got.WallTime, wall)
	}
	if !got.UpdatedAt.Equal(want.UpdatedAt) || got.UpdatedAt.Location() != time.UTC {
		t.Errorf("UpdatedAt = %v, want %v in UTC", got.UpdatedAt, want.UpdatedAt)
	}

	// A second Save replaces the first; a post-batch token has no times.
	pbrt := token(t, "8264F1A2C4000000012B0429296E1404")
	before := time.Now().Add(-time.Second)
	if err := s.Save(ctx, checkpoint.Checkpoint{Source: "orders", Token: pbrt}); err != nil {
		t.Fatalf("Save: %v", err)
	}
	got, _, err = s.Load(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Token, pbrt) || !got.ClusterTime.IsZero() || !got.WallTime.IsZero() {
		t.Errorf("after second Save: %+v", got)
	}
	if got.UpdatedAt.Before(before) {
		t.Errorf("UpdatedAt = %v, want filled with now", got.UpdatedAt)
	}
}

func TestStoreSaveNoToken(t *testing.T) {
	s := checkpoint.NewStore(testDB(t), "checkpoints")
	err := s.Save(testCtx(t), checkpoint.Checkpoint{Source: "orders"})
	if !errors.Is(err, checkpoint.ErrNoToken) {
		t.Fatalf("Save without token = %v, want ErrNoToken", err)
	}
}

func TestStoreListReset(t *testing.T) {
	ctx := testCtx(t)
	s := checkpoint.NewStore(testDB(t), "checkpoints")
	if l, err := s.List(ctx); err != nil || len(l) != 0 {
		t.Fatalf("List on empty = %v, %v", l, err)
	}
	for _, src := range []string{"users", "audit", "orders"} {
		if err := s.Save(ctx, checkpoint.Checkpoint{Source: src, Token: token(t, src)}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cp := range l {
		names = append(names, cp.Source)
		if !bytes.Equal(cp.Token, token(t, cp.Source)) {
			t.Errorf("%s: token %s", cp.Source, cp.Token)
		}
	}
	if got, want := names, []string{"audit", "orders", "users"}; !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}

	ok, err := s.Reset(ctx, "orders")
	if err != nil || !ok {
		t.Fatalf("Reset = %v, %v; want true, nil", ok, err)
	}
	if ok, err := s.Reset(ctx, "orders"); err != nil || ok {
		t.Fatalf("second Reset = %v, %v; want false, nil", ok, err)
	}
	if _, ok, err := s.Load(ctx, "orders"); err != nil || ok {
		t.Fatalf("Load after Reset = %v, %v; want false, nil", ok, err)
	}
	l, err = s.List(ctx)
	if err != nil || len(l) != 2 {
		t.Fatalf("List after Reset = %v, %v", l, err)
	}
}

func TestStoreFencedSave(t *testing.T) {
	ctx := testCtx(t)
	s := checkpoint.NewStore(testDB(t), "checkpoints")
	save := func(epoch int64, data string) error {
		return s.Save(ctx, checkpoint.Checkpoint{Source: "orders", Token: token(t, data), Epoch: epoch})
	}
	loadData := func() (string, int64) {
		t.Helper()
		cp, ok, err := s.Load(ctx, "orders")
		if err != nil || !ok {
			t.Fatalf("Load = %v, %v", ok, err)
		}
		d, _ := cp.Token.Lookup("_data").StringValueOK()
		return d, cp.Epoch
	}

	// A claim before any save is not a checkpoint.
	if err := s.Fence(ctx, "orders", 1); err != nil {
		t.Fatalf("Fence(1): %v", err)
	}
	if _, ok, err := s.Load(ctx, "orders"); err != nil || ok {
		t.Fatalf("Load after Fence only = %v, %v; want none", ok, err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List after Fence only = %v, %v", list, err)
	}
	if err := save(1, "8200000010"); err != nil {
		t.Fatalf("save epoch 1: %v", err)
	}
	if err := save(1, "8200000020"); err != nil {
		t.Fatalf("save epoch 1 forward: %v", err)
	}
	if err := save(1, "8200000020"); err != nil {
		t.Fatalf("save epoch 1 at the same position: %v", err)
	}
	// Backwards is refused, even from the same epoch.
	if err := save(1, "8200000015"); !errors.Is(err, checkpoint.ErrBackwards) {
		t.Fatalf("save backwards = %v, want ErrBackwards", err)
	}
	// Epoch 2 claims it; epoch 1 is then refused and changes nothing.
	if err := s.Fence(ctx, "orders", 2); err != nil {
		t.Fatalf("Fence(2): %v", err)
	}
	if err := save(1, "8200000030"); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("save from epoch 1 after Fence(2) = %v, want ErrFenced", err)
	}
	if d, e := loadData(); d != "8200000020" || e != 2 {
		t.Fatalf("checkpoint = %s epoch %d, want 8200000020 epoch 2", d, e)
	}
	if err := s.Fence(ctx, "orders", 1); !errors.Is(err, checkpoint.ErrFenced) {
		t.Fatalf("Fence(1) after Fence(2) = %v, want ErrFenced", err)
	}
	if err := save(2, "8200000040"); err != nil {
		t.Fatalf("save epoch 2: %v", err)
	}
	if d, e := loadData(); d != "8200000040" || e != 2 {
		t.Fatalf("checkpoint = %s epoch %d", d, e)
	}
	// An unfenced save (cluster mode off) still overwrites, as before.
	if err := save(0, "8200000001"); err != nil {
		t.Fatalf("unfenced save: %v", err)
	}
	if d, e := loadData(); d != "8200000001" || e != 0 {
		t.Fatalf("after unfenced save: %s epoch %d", d, e)
	}
}

// A snapshot's progress survives Save/Load, and a later Save without it
// (the scan finished) removes it.
func TestStoreSnapshotProgress(t *testing.T) {
	ctx := testCtx(t)
	s := checkpoint.NewStore(testDB(t), "checkpoints")
	after, _ := bson.Marshal(bson.D{{Key: "_id", Value: int64(42)}})
	cp := checkpoint.Checkpoint{
		Source: "orders", Token: token(t, "8264F1A2B3000000012B022C0100296E5A1004"),
		Snapshot: &checkpoint.Snapshot{ID: "s1", Namespace: "shop.orders", After: after, Scanned: 43},
	}
	if err := s.Save(ctx, cp); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Load(ctx, "orders")
	if err != nil || !ok || got.Snapshot == nil {
		t.Fatalf("Load = %+v, %v, %v", got, ok, err)
	}
	if sn := got.Snapshot; sn.ID != "s1" || sn.Namespace != "shop.orders" || !bytes.Equal(sn.After, after) || sn.Scanned != 43 {
		t.Fatalf("snapshot = %+v", sn)
	}
	cp.Snapshot = nil
	if err := s.Save(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.Load(ctx, "orders"); got.Snapshot != nil {
		t.Fatalf("snapshot still there after the scan finished: %+v", got.Snapshot)
	}
}
