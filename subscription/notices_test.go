package subscription

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
)

func TestStatusNoticeWhichChangesAreNotified(t *testing.T) {
	at := time.Date(2026, 11, 28, 16, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		from, to Status
		want     string
	}{
		{StatusActive, StatusDisabled, NoticeDisabled},
		{StatusPaused, StatusDisabled, NoticeDisabled},
		{StatusDisabled, StatusActive, NoticeRecovered},
		{StatusPaused, StatusActive, NoticeRecovered},
		{StatusActive, StatusPaused, ""},
		{StatusActive, StatusActive, ""},
		{StatusDisabled, StatusDisabled, ""},
	} {
		n, ok := StatusNotice(c.from, Subscription{Name: "team-a-x", Status: c.to, Revision: 7, Reason: "r"}, "changegate", at)
		if ok != (c.want != "") || n.Type != c.want {
			t.Errorf("%s -> %s: %+v %v, want %q", c.from, c.to, n, ok, c.want)
			continue
		}
		if ok && (n.ID != c.want+":team-a-x:7" || n.Data.PreviousStatus != c.from || n.Data.Actor != "changegate" || !n.Timestamp.Equal(at)) {
			t.Errorf("%s -> %s: %+v", c.from, c.to, n)
		}
	}
}

func TestExhaustedNoticeRedactsTheKey(t *testing.T) {
	key, _ := bson.Marshal(bson.D{{Key: "_id", Value: 1}, {Key: "email", Value: "a@example.com"}})
	ev := &event.Event{ID: "items:82", Source: "items", OperationType: "insert", DB: "shop", Coll: "items", DocumentKey: key}
	sh, err := event.CompileShape(event.ShapeSpec{Redact: []string{"fullDocument.email"}})
	if err != nil {
		t.Fatal(err)
	}
	view, _ := ev.Shaped(sh)
	n := ExhaustedNotice("team-a-x", view, "http_400", 1, "cg-a", time.Unix(0, 0))
	b, _ := json.Marshal(n)
	var back struct {
		Data struct {
			DocumentKey map[string]any `json:"document_key"`
			Namespace   string         `json:"ns"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Data.DocumentKey["email"] == "a@example.com" || back.Data.DocumentKey["_id"] != float64(1) || back.Data.Namespace != "shop.items" {
		t.Fatalf("notice %s", b)
	}
}

func TestNotifierRetriesInOrderAndDropsWhatDoesNotFit(t *testing.T) {
	var (
		mu    sync.Mutex
		got   []string
		tries int
	)
	sink := "ops"
	var smu sync.Mutex
	n := NewNotifier(NotifierOptions{Queue: 2, Attempts: 3, Backoff: time.Millisecond,
		Sink: func() string { smu.Lock(); defer smu.Unlock(); return sink }})
	deliver := func(_ context.Context, s string, ev *event.Event) error {
		mu.Lock()
		defer mu.Unlock()
		tries++
		if s != "ops" {
			t.Errorf("delivered to %q", s)
		}
		if ev.ID == "fails" {
			return errors.New("refused")
		}
		if tries == 1 {
			return errors.New("once") // the first notice delivered on its second attempt
		}
		env, _ := ev.Envelope(false)
		var nt Notice
		if err := json.Unmarshal(env, &nt); err != nil || nt.ID != ev.ID {
			t.Errorf("envelope %s: %v", env, err)
		}
		got = append(got, ev.ID)
		return nil
	}
	// Queued before Run: two fit, the third is dropped.
	for _, id := range []string{"a", "fails", "c"} {
		n.Notify(Notice{ID: id, Type: NoticeExhausted})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.Run(ctx, deliver) }()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if counterValue(n.counts.WithLabelValues(NoticeExhausted, NoticeFailed)) == 1 {
			break
		}
	}
	n.Notify(Notice{ID: "d", Type: NoticeDisabled})
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if counterValue(n.counts.WithLabelValues(NoticeDisabled, NoticeDelivered)) == 1 {
			break
		}
	}
	// events_sink removed: notices are off, dropped uncounted.
	smu.Lock()
	sink = ""
	smu.Unlock()
	if n.Notify(Notice{ID: "e", Type: NoticeDisabled}) {
		t.Error("queued with no events sink")
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "a" || got[1] != "d" {
		t.Fatalf("delivered %v, want [a d]", got)
	}
	for _, c := range []struct {
		typ, outcome string
		want         float64
	}{
		{NoticeExhausted, NoticeDelivered, 1}, {NoticeExhausted, NoticeFailed, 1}, {NoticeExhausted, NoticeQueueFull, 1},
		{NoticeDisabled, NoticeDelivered, 1}, {NoticeDisabled, NoticeQueueFull, 0},
	} {
		if v := counterValue(n.counts.WithLabelValues(c.typ, c.outcome)); v != c.want {
			t.Errorf("%s %s: %v, want %v", c.typ, c.outcome, v, c.want)
		}
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}
