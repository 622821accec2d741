package subscription_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/sinks/webhook"
	"github.com/changegate/changegate/subscription"
	"github.com/changegate/changegate/test/mongotest"
)

// clock is a settable clock for the store.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}
func (b *syncBuffer) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

type fixture struct {
	store *subscription.Store
	db    *mongo.Database
	clock *clock
	log   *syncBuffer
	ctx   context.Context
}

func newFixture(t *testing.T, withKey bool) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	f := &fixture{db: mongotest.Database(t, "cgtest_subs_"), clock: &clock{t: time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)}, log: &syncBuffer{}, ctx: ctx}
	var sealer *subscription.Sealer
	if withKey {
		var err error
		if sealer, err = subscription.NewSealer(bytes.Repeat([]byte{7}, 32)); err != nil {
			t.Fatal(err)
		}
	}
	f.store = subscription.NewStore(f.db, subscription.Options{Sealer: sealer, Now: f.clock.now,
		Log: slog.New(slog.NewTextHandler(f.log, nil))})
	if err := f.store.EnsureIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	return f
}

func spec(name, url string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"name":%q,"source":"orders","sink":{"type":"webhook","url":%q}}`, name, url))
}

func TestStoreLifecycle(t *testing.T) {
	f := newFixture(t, true)
	ctx, s := f.ctx, f.store
	sub, secret, err := s.Create(ctx, "team-a", "team-a-orders", spec("team-a-orders", "https://a.example.com/"), 10)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Status != subscription.StatusActive || sub.Revision != 1 || !strings.HasPrefix(secret.Value(), "whsec_") || len(sub.Secrets) != 1 {
		t.Fatalf("created %+v", sub)
	}
	if _, _, err := s.Create(ctx, "team-a", "team-a-orders", spec("team-a-orders", "https://a.example.com/"), 10); !errors.Is(err, subscription.ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}
	got, err := s.Get(ctx, "team-a-orders")
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Spec) != string(sub.Spec) || got.Revision != 1 || !got.CreatedAt.Equal(f.clock.now()) {
		t.Errorf("read back %+v", got)
	}
	secrets, err := got.SigningSecrets(f.clock.now(), s.Sealer())
	if err != nil || len(secrets) != 1 || secrets[0] != secret {
		t.Errorf("signing secrets: %d, %v", len(secrets), err)
	}

	// Optimistic concurrency: a change against an old revision is refused.
	f.clock.add(time.Minute)
	upd, err := s.Update(ctx, "team-b", "team-a-orders", 1, spec("team-a-orders", "https://a2.example.com/"))
	if err != nil || upd.Revision != 2 || !upd.UpdatedAt.Equal(f.clock.now()) {
		t.Fatalf("update: %+v, %v", upd, err)
	}
	if _, err := s.Update(ctx, "team-b", "team-a-orders", 1, spec("team-a-orders", "https://a3.example.com/")); !errors.Is(err, subscription.ErrConflict) {
		t.Errorf("update of revision 1 after revision 2: %v, want ErrConflict", err)
	}
	p, err := s.SetStatus(ctx, "admin", "team-a-orders", 0, subscription.StatusPaused, "maintenance")
	if err != nil || p.Status != subscription.StatusPaused || p.Reason != "maintenance" || p.Revision != 3 {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	r, err := s.SetStatus(ctx, "admin", "team-a-orders", 3, subscription.StatusActive, "ignored")
	if err != nil || r.Status != subscription.StatusActive || r.Reason != "" || r.Revision != 4 || string(r.Spec) != string(upd.Spec) {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	if _, err := s.Delete(ctx, "admin", "team-a-orders", 3); !errors.Is(err, subscription.ErrConflict) {
		t.Errorf("delete of an old revision: %v, want ErrConflict", err)
	}
	if _, err := s.Delete(ctx, "admin", "team-a-orders", 4); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "team-a-orders"); !errors.Is(err, subscription.ErrNotFound) {
		t.Errorf("get after delete: %v", err)
	}
	for _, err := range []error{
		func() error {
			_, err := s.Delete(ctx, "admin", "team-a-orders", 0)
			return err
		}(),
		func() error {
			_, err := s.Update(ctx, "admin", "team-a-orders", 0, spec("x", "https://x/"))
			return err
		}(),
		func() error {
			_, _, err := s.RotateSecret(ctx, "admin", "team-a-orders", 0, time.Hour)
			return err
		}(),
	} {
		if !errors.Is(err, subscription.ErrNotFound) {
			t.Errorf("change after delete: %v, want ErrNotFound", err)
		}
	}
}

func TestStoreConcurrentChangesAllLand(t *testing.T) {
	f := newFixture(t, true)
	if _, _, err := f.store.Create(f.ctx, "admin", "a", spec("a", "https://a.example.com/"), 10); err != nil {
		t.Fatal(err)
	}
	// Eight writers without a precondition: each change is applied once,
	// none lost (a conflict re-reads and re-applies).
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := subscription.StatusPaused
			if i%2 == 0 {
				st = subscription.StatusActive
			}
			_, err := f.store.SetStatus(f.ctx, fmt.Sprint("w", i), "a", 0, st, "")
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	sub, err := f.store.Get(f.ctx, "a")
	if err != nil || sub.Revision != 9 {
		t.Errorf("revision after 8 changes = %d (%v), want 9", sub.Revision, err)
	}
	audit, err := f.store.Audit(f.ctx, "a", 0)
	if err != nil || len(audit) != 9 {
		t.Errorf("audit records = %d (%v), want 9", len(audit), err)
	}
}

func TestStoreLimitsAndNoKey(t *testing.T) {
	f := newFixture(t, false)
	_, _, err := f.store.Create(f.ctx, "admin", "a", spec("a", "https://a.example.com/"), 10)
	if !errors.Is(err, subscription.ErrNoKey) || !strings.Contains(err.Error(), "CHANGEGATE_SECRET_KEY or [subscriptions] key_file") {
		t.Errorf("create without a key: %v", err)
	}
	f = newFixture(t, true)
	for _, n := range []string{"a", "b"} {
		if _, _, err := f.store.Create(f.ctx, "admin", n, spec(n, "https://a.example.com/"), 2); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := f.store.Create(f.ctx, "admin", "c", spec("c", "https://a.example.com/"), 2); !errors.Is(err, subscription.ErrLimit) {
		t.Errorf("third create with max 2: %v, want ErrLimit", err)
	}
	if _, _, err := f.store.RotateSecret(f.ctx, "admin", "a", 0, subscription.MaxOverlap+time.Second); err == nil {
		t.Error("an overlap over the maximum was accepted")
	}
}

func TestStoreListPages(t *testing.T) {
	f := newFixture(t, true)
	var want []string
	for i := range 7 {
		for _, team := range []string{"team-a-", "team-b-"} {
			n := fmt.Sprintf("%s%02d", team, i)
			if _, _, err := f.store.Create(f.ctx, "admin", n, spec(n, "https://a.example.com/"), 100); err != nil {
				t.Fatal(err)
			}
			if team == "team-a-" {
				want = append(want, n)
			}
		}
	}
	var got []string
	cursor, pages := "", 0
	for {
		p, err := f.store.List(f.ctx, subscription.ListOptions{Prefix: "team-a-", Cursor: cursor, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, s := range p.Subscriptions {
			got = append(got, s.Name)
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
	}
	if strings.Join(got, ",") != strings.Join(want, ",") || pages != 3 {
		t.Errorf("pages %d: %v, want %v", pages, got, want)
	}
	all, err := f.store.List(f.ctx, subscription.ListOptions{})
	if err != nil || len(all.Subscriptions) != 14 || all.Next != "" {
		t.Errorf("list all: %d, next %q, %v", len(all.Subscriptions), all.Next, err)
	}
	if _, err := f.store.List(f.ctx, subscription.ListOptions{Cursor: "!!"}); !errors.Is(err, subscription.ErrBadCursor) {
		t.Errorf("bad cursor: %v", err)
	}
}

func TestRotationOverlapSignsWithBoth(t *testing.T) {
	f := newFixture(t, true)
	_, first, err := f.store.Create(f.ctx, "team-a", "a", spec("a", "https://a.example.com/"), 10)
	if err != nil {
		t.Fatal(err)
	}
	f.clock.add(time.Hour)
	sub, second, err := f.store.RotateSecret(f.ctx, "team-a", "a", 0, 0)
	if err != nil || sub.Revision != 2 || second == first {
		t.Fatalf("rotate: %+v, %v", sub, err)
	}
	// The default overlap, as the API asks for it.
	sub, third, err := f.store.RotateSecret(f.ctx, "team-a", "a", 2, subscription.DefaultOverlap)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"id":"orders:1"}`)
	check := func(at time.Time, verifies map[config.Secret]bool) {
		t.Helper()
		secrets, err := sub.SigningSecrets(at, f.store.Sealer())
		if err != nil {
			t.Fatal(err)
		}
		plain := make([]string, len(secrets))
		for i, s := range secrets {
			plain[i] = s.Value()
		}
		sig, err := webhook.Sign(plain, "msg_1", at, body)
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{}
		h.Set(webhook.HeaderID, "msg_1")
		h.Set(webhook.HeaderTimestamp, fmt.Sprint(at.Unix()))
		h.Set(webhook.HeaderSignature, sig)
		for secret, want := range verifies {
			err := webhook.Verify([]string{secret.Value()}, h, body, time.Minute, at)
			if (err == nil) != want {
				t.Errorf("at %s: a receiver with one of the secrets verifies: %v, want %v", at, err, want)
			}
		}
	}
	now := f.clock.now()
	// The second secret (rotated out with the default overlap) signs for
	// 24 h beside the third; the first was rotated out without overlap.
	check(now, map[config.Secret]bool{third: true, second: true, first: false})
	check(now.Add(subscription.DefaultOverlap-time.Second), map[config.Secret]bool{third: true, second: true})
	check(now.Add(subscription.DefaultOverlap), map[config.Secret]bool{third: true, second: false})
}

func TestAuditRecordsNeverTheSecret(t *testing.T) {
	f := newFixture(t, true)
	ctx, s := f.ctx, f.store
	_, secret, err := s.Create(ctx, "team-a", "team-a-x", spec("team-a-x", "https://a.example.com/"), 10)
	if err != nil {
		t.Fatal(err)
	}
	f.clock.add(time.Second)
	if _, err := s.Update(ctx, "team-a", "team-a-x", 1, json.RawMessage(`{"name":"team-a-x","source":"orders","envelope":"key","sink":{"type":"webhook","url":"https://b.example.com/"}}`)); err != nil {
		t.Fatal(err)
	}
	f.clock.add(time.Second)
	if _, err := s.SetStatus(ctx, "admin", "team-a-x", 0, subscription.StatusPaused, "receiver down"); err != nil {
		t.Fatal(err)
	}
	f.clock.add(time.Second)
	if _, err := s.SetStatus(ctx, "admin", "team-a-x", 0, subscription.StatusActive, ""); err != nil {
		t.Fatal(err)
	}
	f.clock.add(time.Second)
	_, rotated, err := s.RotateSecret(ctx, "team-a", "team-a-x", 0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f.clock.add(time.Second)
	if _, err := s.Delete(ctx, "team-a", "team-a-x", 0); err != nil {
		t.Fatal(err)
	}
	records, err := s.Audit(ctx, "team-a-x", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range records {
		got = append(got, fmt.Sprintf("%s %s %s rev %d %q", r.At.Format("15:04:05"), r.Actor, r.Action, r.Revision, r.Detail))
	}
	want := []string{ // newest first
		`10:00:05 team-a delete rev 5 "parked and dead-lettered entries removed after 0s"`,
		`10:00:04 team-a rotate-secret rev 5 "overlap 1h0m0s"`,
		`10:00:03 admin resume rev 4 ""`,
		`10:00:02 admin pause rev 3 "receiver down"`,
		`10:00:01 team-a update rev 2 "changed: envelope, sink"`,
		`10:00:00 team-a create rev 1 ""`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("audit log:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	log := f.log.String()
	for _, a := range []string{"create", "update", "pause", "resume", "rotate-secret", "delete"} {
		if !strings.Contains(log, "msg=\"subscription audit\" actor=") || !strings.Contains(log, "action="+a+" subscription=team-a-x") {
			t.Errorf("the process log lacks the %s record:\n%s", a, log)
		}
	}
	// Neither secret anywhere: process log, audit log, stored documents.
	var stored bytes.Buffer
	for _, coll := range []string{subscription.DefaultCollection, subscription.DefaultAuditCollection} {
		cur, err := f.db.Collection(coll).Find(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		for cur.Next(ctx) {
			stored.Write(cur.Current)
		}
		cur.Close(ctx)
	}
	for _, sec := range []config.Secret{secret, rotated} {
		key := strings.TrimPrefix(sec.Value(), "whsec_")
		if strings.Contains(log, key) || strings.Contains(stored.String(), key) {
			t.Errorf("a secret is in the log or the database")
		}
	}
}

func TestCreatedClusterTime(t *testing.T) {
	f := newFixture(t, true)
	// A write before the creation: the subscription's cluster time is not
	// before it, so changes after the creation are at or after it.
	sess, err := f.db.Client().StartSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.EndSession(f.ctx)
	if _, err := f.db.Collection("orders").InsertOne(mongo.NewSessionContext(f.ctx, sess), bson.D{{Key: "x", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	before := *sess.OperationTime()
	sub, _, err := f.store.Create(f.ctx, "admin", "a", spec("a", "https://a.example.com/"), 10)
	if err != nil {
		t.Fatal(err)
	}
	if sub.CreatedClusterTime.IsZero() || sub.CreatedClusterTime.Before(before) {
		t.Errorf("created cluster time %v, a write before the creation was at %v", sub.CreatedClusterTime, before)
	}
	got, err := f.store.Get(f.ctx, "a")
	if err != nil || got.CreatedClusterTime != sub.CreatedClusterTime {
		t.Errorf("stored cluster time %v (%v), want %v", got.CreatedClusterTime, err, sub.CreatedClusterTime)
	}
}

// TestStoredFormatVersions reads the stored form of format 1 (testdata,
// the fixture the next format's upgrade test starts from) and refuses
// documents it cannot read with a clear error.
func TestStoredFormatVersions(t *testing.T) {
	f := newFixture(t, true)
	data, err := os.ReadFile("testdata/subscription-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc bson.D
	if err := bson.UnmarshalExtJSON(data, true, &doc); err != nil {
		t.Fatal(err)
	}
	coll := f.db.Collection(subscription.DefaultCollection)
	if _, err := coll.InsertOne(f.ctx, doc); err != nil {
		t.Fatal(err)
	}
	sub, err := f.store.Get(f.ctx, "team-a-paid")
	if err != nil {
		t.Fatal(err)
	}
	if sub.Status != subscription.StatusPaused || sub.Reason != "receiver maintenance" || sub.Revision != 3 ||
		sub.CreatedClusterTime != (bson.Timestamp{T: 1795000000, I: 4}) ||
		!sub.CreatedAt.Equal(time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)) || len(sub.Secrets) != 2 ||
		!sub.Secrets[1].ExpiresAt.Equal(time.Date(2026, 11, 29, 9, 30, 0, 0, time.UTC)) ||
		!strings.Contains(string(sub.Spec), `"url":"https://a.example.com/hooks"`) {
		t.Errorf("format 1 read as %+v", sub)
	}
	// A document of a later format, and one without a version.
	for _, d := range []bson.D{
		{{Key: "_id", Value: "newer"}, {Key: "version", Value: 2}, {Key: "spec", Value: "{}"}},
		{{Key: "_id", Value: "unversioned"}, {Key: "spec", Value: "{}"}},
	} {
		if _, err := coll.InsertOne(f.ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	_, err = f.store.Get(f.ctx, "newer")
	if !errors.Is(err, subscription.ErrFormat) || !strings.Contains(err.Error(), "format 2 was written by a newer changegate (this one reads formats 1 to 1)") {
		t.Errorf("newer format: %v", err)
	}
	if _, err := f.store.Get(f.ctx, "unversioned"); !errors.Is(err, subscription.ErrFormat) || !strings.Contains(err.Error(), "no format version") {
		t.Errorf("no version: %v", err)
	}
	// A change rewrites the document in the current format, keeping what
	// it does not change.
	up, err := f.store.SetStatus(f.ctx, "admin", "team-a-paid", 3, subscription.StatusActive, "")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := coll.FindOne(f.ctx, bson.D{{Key: "_id", Value: "team-a-paid"}}).Raw()
	if err != nil {
		t.Fatal(err)
	}
	if v := raw.Lookup("version").AsInt64(); v != subscription.FormatVersion || up.Revision != 4 || len(up.Secrets) != 2 {
		t.Errorf("rewritten as version %d, %+v", v, up)
	}
}

func TestWatchSeesEveryChange(t *testing.T) {
	f := newFixture(t, true)
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	type call struct {
		names []string
		revs  []int64
	}
	calls := make(chan call, 100)
	done := make(chan error, 1)
	go func() {
		done <- f.store.Watch(ctx, 50*time.Millisecond, func(subs []subscription.Subscription) {
			var c call
			for _, s := range subs {
				c.names = append(c.names, s.Name)
				c.revs = append(c.revs, s.Revision)
			}
			calls <- c
		})
	}()
	next := func(what string) call {
		t.Helper()
		select {
		case c := <-calls:
			return c
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: not applied within 2 s", what)
		}
		return call{}
	}
	if c := next("start"); len(c.names) != 0 {
		t.Fatalf("first set: %v", c)
	}
	if _, _, err := f.store.Create(f.ctx, "admin", "a", spec("a", "https://a.example.com/"), 10); err != nil {
		t.Fatal(err)
	}
	if c := next("create"); fmt.Sprint(c) != "{[a] [1]}" {
		t.Errorf("after create: %v", c)
	}
	if _, err := f.store.SetStatus(f.ctx, "admin", "a", 0, subscription.StatusPaused, ""); err != nil {
		t.Fatal(err)
	}
	if c := next("pause"); fmt.Sprint(c) != "{[a] [2]}" {
		t.Errorf("after pause: %v", c)
	}
	// Deleted and created again: revision 1 again, seen all the same.
	if _, err := f.store.Delete(f.ctx, "admin", "a", 0); err != nil {
		t.Fatal(err)
	}
	f.clock.add(time.Second)
	if _, _, err := f.store.Create(f.ctx, "admin", "a", spec("a", "https://a.example.com/"), 10); err != nil {
		t.Fatal(err)
	}
	for c := next("delete and create"); fmt.Sprint(c) != "{[a] [1]}"; c = next("create after delete") {
		if fmt.Sprint(c) != "{[] []}" {
			t.Fatalf("after delete and create: %v", c)
		}
	}
	// A rotation's overlap ending re-applies the set (without the old
	// secret), with no write.
	if _, _, err := f.store.RotateSecret(f.ctx, "admin", "a", 0, time.Hour); err != nil {
		t.Fatal(err)
	}
	next("rotate")
	select {
	case c := <-calls:
		t.Fatalf("applied again without a change: %v", c)
	case <-time.After(200 * time.Millisecond):
	}
	f.clock.add(time.Hour)
	if c := next("overlap end"); fmt.Sprint(c) != "{[a] [2]}" {
		t.Errorf("after the overlap: %v", c)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Watch returned %v", err)
	}
}
