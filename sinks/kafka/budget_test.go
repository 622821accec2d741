package kafka

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

// budgetSink returns the Send of a Kafka sink whose broker holds its first
// produce request in h: Succeed lets the broker answer it, Fail answers
// INVALID_RECORD (permanent, not retried), Cancel never answers.
func budgetSink(evs []*event.Event, mod func(*Config)) func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
	return func(t *testing.T, h *sinktest.Hook) func(context.Context) error {
		c := newCluster(t)
		var seen atomic.Bool
		c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if seen.Swap(true) {
				return nil, nil, false
			}
			switch h.Wait(0) {
			case sinktest.Fail:
				pr := req.(*kmsg.ProduceRequest)
				resp := pr.ResponseKind().(*kmsg.ProduceResponse)
				for _, rt := range pr.Topics {
					st := kmsg.NewProduceResponseTopic()
					st.Topic, st.TopicID = rt.Topic, rt.TopicID
					for _, rp := range rt.Partitions {
						sp := kmsg.NewProduceResponseTopicPartition()
						sp.Partition, sp.ErrorCode = rp.Partition, kerr.InvalidRecord.Code
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			case sinktest.Cancel:
				return nil, nil, true // never answered
			}
			return nil, nil, false
		})
		k := newSink(t, c, mod)
		return func(ctx context.Context) error { return k.Send(ctx, evs) }
	}
}

// TestBudgetChargesProduce: the records a Send produces (what the client
// encodes into produce requests, RecordSize each) are charged to the byte
// budget of Send's context while they are produced, and returned after it
// on success, on a refusal and on cancellation.
func TestBudgetChargesProduce(t *testing.T) {
	var evs []*event.Event
	want := int64(0)
	for i := range 5 {
		e := change(t, i, i, "insert", "orders", 2000)
		env, err := e.Envelope(false)
		if err != nil {
			t.Fatal(err)
		}
		want += int64(RecordSize(Key(e), env, Headers(e)))
		evs = append(evs, e)
	}
	sinktest.CheckBudget(t, budgetSink(evs, nil), func(held, _ int64) string {
		if held != want {
			return fmt.Sprintf("want the records' sizes, %d", want)
		}
		return ""
	})
}

// TestBudgetChargesStrippedPayload: with oversize = "strip", the stripped
// envelope made for the Send is charged besides its record.
func TestBudgetChargesStrippedPayload(t *testing.T) {
	small := change(t, 1, 1, "insert", "orders", 10)
	big := change(t, 2, 2, "insert", "orders", 8000)
	env, _ := small.Envelope(false)
	st, err := big.StrippedEnvelope(false, event.StripDocuments)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(RecordSize(Key(small), env, Headers(small)) + RecordSize(Key(big), st, Headers(big)) + cap(st))
	sinktest.CheckBudget(t, budgetSink([]*event.Event{small, big}, func(c *Config) {
		c.MaxRequestBytes = 4096
		c.Oversize = sinks.Oversize{Strip: true}
	}), func(held, _ int64) string {
		if held != want {
			return fmt.Sprintf("want both records and the stripped envelope, %d", want)
		}
		return ""
	})
}
