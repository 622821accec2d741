package subscription

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/observe"
)

// Operational notices ([subscriptions] events_sink): what changegate tells
// a subscription's owner about it, as Standard Webhooks event types.
const (
	// NoticeDisabled: disable_after disabled the subscription (its
	// endpoint failed without a success for that long); data.reason says
	// why.
	NoticeDisabled = "subscription.disabled"
	// NoticeRecovered: a paused or disabled subscription was resumed;
	// data.previous_status says which it was.
	NoticeRecovered = "subscription.recovered"
	// NoticeExhausted: the subscription dead-lettered an event (its
	// retries exhausted, or a permanent failure); data names the event.
	NoticeExhausted = "delivery.exhausted"
)

// NoticeSource is the source of a notice's envelope ("source" of the event
// the events sink gets, for receivers that sort by source).
const NoticeSource = "changegate"

// Notice is one operational notice: the envelope the events sink receives,
// {"id", "type", "timestamp", "data"} (the Standard Webhooks payload
// structure, with an id that is the same for every delivery of the notice).
type Notice struct {
	ID        string     `json:"id"`
	Type      string     `json:"type"`
	Timestamp time.Time  `json:"timestamp"`
	Data      NoticeData `json:"data"`
}

// NoticeData is a notice's data: the subscription, and what happened to it.
// Nothing of a change's payload: an exhausted delivery names the event
// (id, source, namespace, operation, its document key as the
// subscription's shape sends it) and the reason.
type NoticeData struct {
	Subscription   string          `json:"subscription"`
	Status         Status          `json:"status,omitempty"`
	PreviousStatus Status          `json:"previous_status,omitempty"`
	Reason         string          `json:"reason,omitempty"`
	Actor          string          `json:"actor,omitempty"`
	Revision       int64           `json:"revision,omitempty"`
	EventID        string          `json:"event_id,omitempty"`
	Source         string          `json:"source,omitempty"`
	Namespace      string          `json:"ns,omitempty"`
	OperationType  string          `json:"operation_type,omitempty"`
	DocumentKey    json.RawMessage `json:"document_key,omitempty"`
	Attempts       int             `json:"attempts,omitempty"`
	Replica        string          `json:"replica,omitempty"`
}

// StatusNotice returns the notice of a status change of sub (after it),
// from previous, made by actor; ok is false for a change that is not
// notified (a pause by a user: its owner made it).
func StatusNotice(previous Status, sub Subscription, actor string, at time.Time) (n Notice, ok bool) {
	switch {
	case sub.Status == StatusDisabled && previous != StatusDisabled:
		n.Type = NoticeDisabled
	case sub.Status == StatusActive && previous != StatusActive:
		n.Type = NoticeRecovered
	default:
		return Notice{}, false
	}
	// The revision makes the id: each status change is notified once,
	// whoever retries its delivery.
	n.ID = fmt.Sprintf("%s:%s:%d", n.Type, sub.Name, sub.Revision)
	n.Timestamp = at.UTC()
	n.Data = NoticeData{Subscription: sub.Name, Status: sub.Status, PreviousStatus: previous,
		Reason: sub.Reason, Actor: actor, Revision: sub.Revision}
	return n, true
}

// ExhaustedNotice returns the notice of ev dead-lettered by the sink of
// subscription name, with reason, after attempts.
func ExhaustedNotice(name string, ev *event.Event, reason string, attempts int, replica string, at time.Time) Notice {
	d := NoticeData{Subscription: name, EventID: ev.ID, Source: ev.Source, OperationType: ev.OperationType,
		Reason: reason, Attempts: attempts, Replica: replica}
	if ev.DB != "" {
		d.Namespace = ev.DB
		if ev.Coll != "" {
			d.Namespace += "." + ev.Coll
		}
	}
	if len(ev.DocumentKey) > 0 {
		// The key as the subscription's shape shows it (a field it
		// redacts is redacted), as relaxed Extended JSON.
		if k, err := ev.Shape().RedactKey(ev.DocumentKey); err == nil {
			if b, err := bson.MarshalExtJSON(k, false, false); err == nil {
				d.DocumentKey = b
			}
		}
	}
	return Notice{ID: NoticeExhausted + ":" + name + ":" + ev.ID, Type: NoticeExhausted, Timestamp: at.UTC(), Data: d}
}

// DeliverFunc delivers a notice's event through the named sink, with the
// sink's retry policy, and returns the last error if it did not.
type DeliverFunc func(ctx context.Context, sink string, ev *event.Event) error

// NotifierOptions configure a Notifier.
type NotifierOptions struct {
	// Queue bounds the notices waiting to be delivered (default 256);
	// what does not fit is dropped and counted.
	Queue int
	// Attempts bounds the deliveries of one notice, each with the sink's
	// own retry policy, Backoff apart, doubling up to a minute (defaults
	// 5 and 5 s): a notice the sink still refuses is dropped and logged.
	Attempts int
	Backoff  time.Duration
	// Sink returns the events sink's name in force ("": notices are
	// off, Notify drops them uncounted).
	Sink func() string
	// Registerer registers changegate_subscription_notices_total (nil:
	// none).
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Notifier delivers notices to the events sink in order, one at a time,
// off every other path: Notify never blocks (a full queue drops the notice
// and counts it). Notices are best effort: they live in memory only, and
// a process that stops with notices queued loses them (counted as
// "stopped"); the facts they report stay in the store (the subscription's
// status and reason, the dead letters, the audit log).
type Notifier struct {
	sink     func() string
	queue    chan Notice
	lastDrop atomic.Int64 // unix nanos of the last drop logged
	attempts int
	backoff  time.Duration
	log      *slog.Logger
	counts   *prometheus.CounterVec
}

// Notice outcomes, the outcome label of changegate_subscription_notices_total.
const (
	NoticeDelivered = "delivered"
	NoticeQueueFull = "queue_full"
	NoticeFailed    = "failed"
	NoticeStopped   = "stopped"
)

// NewNotifier returns a Notifier; Run delivers what it queues.
func NewNotifier(o NotifierOptions) *Notifier {
	if o.Queue <= 0 {
		o.Queue = 256
	}
	if o.Attempts <= 0 {
		o.Attempts = 5
	}
	if o.Backoff <= 0 {
		o.Backoff = 5 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Sink == nil {
		o.Sink = func() string { return "" }
	}
	n := &Notifier{sink: o.Sink, queue: make(chan Notice, o.Queue), attempts: o.Attempts, backoff: o.Backoff, log: o.Log,
		counts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "changegate_subscription_notices_total",
			Help: "Operational notices of subscriptions ([subscriptions] events_sink), by type and outcome: delivered, queue_full, failed (the events sink refused it), stopped (queued at shutdown).",
		}, []string{"type", "outcome"})}
	if o.Registerer != nil {
		_ = o.Registerer.Register(n.counts)
	}
	return n
}

// Notify queues n; it never blocks. It reports whether n was queued.
func (n *Notifier) Notify(nt Notice) bool {
	if n == nil || n.sink() == "" {
		return false
	}
	select {
	case n.queue <- nt:
		return true
	default:
		n.counts.WithLabelValues(nt.Type, NoticeQueueFull).Inc()
		// Logged at most once a minute: a receiver refusing everything
		// dead-letters (and notifies) every event.
		now := time.Now().UnixNano()
		if last := n.lastDrop.Load(); now-last > int64(time.Minute) && n.lastDrop.CompareAndSwap(last, now) {
			n.log.Warn("subscription notices dropped: the queue is full (changegate_subscription_notices_total{outcome=\"queue_full\"} counts them)",
				"type", nt.Type, "subscription", nt.Data.Subscription)
		}
		return false
	}
}

// Run delivers the queued notices with deliver until ctx ends.
func (n *Notifier) Run(ctx context.Context, deliver DeliverFunc) {
	for {
		select {
		case <-ctx.Done():
			for {
				select {
				case nt := <-n.queue:
					n.counts.WithLabelValues(nt.Type, NoticeStopped).Inc()
				default:
					return
				}
			}
		case nt := <-n.queue:
			n.deliver(ctx, deliver, nt)
		}
	}
}

func (n *Notifier) deliver(ctx context.Context, deliver DeliverFunc, nt Notice) {
	body, err := json.Marshal(nt)
	if err != nil {
		n.log.Error("subscription notice: cannot encode it", "type", nt.Type, "err", err)
		n.counts.WithLabelValues(nt.Type, NoticeFailed).Inc()
		return
	}
	wait := n.backoff
	for attempt := 1; ; attempt++ {
		ev := event.NewNotice(nt.ID, NoticeSource, nt.Type, nt.Timestamp, body)
		sink := n.sink()
		err := errors.New("no events_sink configured")
		if sink != "" {
			err = deliver(ctx, sink, ev)
		}
		if err == nil {
			n.counts.WithLabelValues(nt.Type, NoticeDelivered).Inc()
			return
		}
		if ctx.Err() != nil {
			n.counts.WithLabelValues(nt.Type, NoticeStopped).Inc()
			return
		}
		if attempt >= n.attempts {
			n.counts.WithLabelValues(nt.Type, NoticeFailed).Inc()
			n.log.Error("subscription notice not delivered: the events sink refused it", "type", nt.Type,
				"subscription", nt.Data.Subscription, "id", nt.ID, "attempts", attempt, "err", err)
			return
		}
		n.log.Warn("subscription notice not delivered yet; retrying", "type", nt.Type, "subscription", nt.Data.Subscription,
			"attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			n.counts.WithLabelValues(nt.Type, NoticeStopped).Inc()
			return
		case <-t.C:
		}
		wait = min(2*wait, time.Minute)
	}
}

// NoticeObserver returns an observer of the router (package observe) that
// gives n a delivery.exhausted notice for each event the sink of a
// subscription dead-letters (isSub tells a subscription's sink from the
// file's); replica names this process in the notice.
func NoticeObserver(n *Notifier, isSub func(sink string) bool, replica string) observe.Observer {
	return &noticeObserver{n: n, isSub: isSub, replica: replica}
}

type noticeObserver struct {
	n       *Notifier
	isSub   func(string) bool
	replica string
}

func (o *noticeObserver) Dispatched(observe.Dispatch) {}

func (o *noticeObserver) AttemptStart(ctx context.Context, _ observe.Attempt) context.Context {
	return ctx
}

func (o *noticeObserver) AttemptEnd(context.Context, observe.Attempt) {}

func (o *noticeObserver) Outcome(oc observe.Outcome) {
	if oc.Kind != observe.DeadLettered || oc.Event == nil || !o.isSub(oc.Sink.Name) {
		return
	}
	o.n.Notify(ExhaustedNotice(oc.Sink.Name, oc.Event, oc.Reason, oc.Attempts, o.replica, time.Now()))
}
