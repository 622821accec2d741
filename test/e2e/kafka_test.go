package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/changegate/changegate/deadletter"
)

// kafkaConsumer reads every record of a topic from the start, in the
// background.
type kafkaConsumer struct {
	mu   sync.Mutex
	recs []*kgo.Record
}

func consumeKafka(t *testing.T, c *kfake.Cluster, topic string) *kafkaConsumer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	kc := &kafkaConsumer{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			kc.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) { kc.recs = append(kc.recs, r) })
			kc.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return kc
}

func (kc *kafkaConsumer) records() []*kgo.Record {
	kc.mu.Lock()
	defer kc.mu.Unlock()
	return append([]*kgo.Record(nil), kc.recs...)
}

// version is the change a record carries for its document: 0 for the
// insert, k for the k-th round of updates (n = k*1000 + id).
func version(t *testing.T, r *kgo.Record) (doc, v int) {
	t.Helper()
	env := parseEnvelope(t, string(r.Value))
	if env.Update.Fields.N != nil {
		v = *env.Update.Fields.N / 1000
	}
	return env.DocumentKey.ID, v
}

// writeRounds inserts docs documents, then updates the first updated of
// them rounds times (n = round*1000 + id).
func writeRounds(c *mongo.Collection, docs, updated, rounds int) error {
	if err := insertDocs(c, 0, docs); err != nil {
		return err
	}
	for round := 1; round <= rounds; round++ {
		for i := range updated {
			_, err := c.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: i}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: round*1000 + i}}}})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// TestKafkaProcessSIGKILLKeepsDocumentOrder runs the real binary with a
// kafka sink against an in-process kfake cluster whose broker refuses every
// fifth produce request (NOT_ENOUGH_REPLICAS, retried by the client and
// then by the engine), kills it with SIGKILL in the middle of the stream
// and restarts it. Every change reaches the topic; each document's records
// are in one partition, keyed by the document key, and in change order:
// a re-delivery only rewinds, and a rewind is followed by every later
// change again; a change re-delivered keeps its id header.
func TestKafkaProcessSIGKILLKeepsDocumentOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	e := newEnv(t)
	topic := "cdc." + e.db + ".items"
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.SeedTopics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var produces, refused atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if produces.Add(1)%5 != 0 {
			return nil, nil, false
		}
		refused.Add(1)
		pr := req.(*kmsg.ProduceRequest)
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, kerr.NotEnoughReplicas.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	kc := consumeKafka(t, c, topic)

	brokers := `"` + strings.Join(c.ListenAddrs(), `", "`) + `"`
	tmpl := itemsHead + fmt.Sprintf(`
[[sinks]]
name = "cdc"
type = "kafka"
brokers = [%s]
topic = "cdc.{db}.{coll}"
batch_size = 20
max_in_flight = 8
park_after = "0s"
  [sinks.retry]
  max_attempts = 1000
  initial_interval = "20ms"
  max_interval = "100ms"
  max_elapsed = "0s"

[[rules]]
name = "all"
source = "items"
sinks = ["cdc"]
`, brokers)
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 30*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})

	const docs, updated, rounds = 1000, 250, 3
	total := docs + updated*rounds
	writeErr := make(chan error, 1)
	go func() { writeErr <- writeRounds(e.coll("items"), docs, updated, rounds) }()
	waitFor(t, 60*time.Second, "some records", func() bool { return len(kc.records()) > 300 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	before := len(kc.records())
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	if before >= total {
		t.Fatalf("everything was produced before SIGKILL (%d records); the test proves nothing", before)
	}

	p2 := startProcess(t, bin, cfgPath)
	type change struct{ doc, v int }
	seenN := 0
	t.Cleanup(func() {
		if t.Failed() {
			p2.cmd.Process.Kill() // stop its output before reading it
			p2.cmd.Wait()
			t.Logf("%d of %d changes seen; before SIGKILL:\n%s\nafter the restart:\n%s", seenN, total, p.out, p2.out)
		}
	})
	waitFor(t, 120*time.Second, "every change in the topic after the restart", func() bool {
		seen := map[change]bool{}
		for _, r := range kc.records() {
			d, v := version(t, r)
			seen[change{d, v}] = true
		}
		seenN = len(seen)
		return len(seen) >= total
	})

	recs := kc.records()
	perDoc := map[int][]int{}
	partition := map[int]int32{}
	ids := map[change]string{}
	for _, r := range recs {
		d, v := version(t, r)
		if want := fmt.Sprintf(`{"_id":{"$numberInt":"%d"}}`, d); string(r.Key) != want {
			t.Fatalf("record of document %d: key %s, want %s", d, r.Key, want)
		}
		if p, ok := partition[d]; ok && p != r.Partition {
			t.Fatalf("document %d in partitions %d and %d", d, p, r.Partition)
		}
		partition[d] = r.Partition
		var id string
		for _, h := range r.Headers {
			if h.Key == "id" {
				id = string(h.Value)
			}
		}
		if first, ok := ids[change{d, v}]; ok && first != id {
			t.Fatalf("document %d change %d re-delivered with id %s, first %s", d, v, id, first)
		}
		ids[change{d, v}] = id
		perDoc[d] = append(perDoc[d], v)
	}
	dups := 0
	for d, vs := range perDoc {
		final := 0
		if d < updated {
			final = rounds
		}
		ok := vs[0] == 0 && vs[len(vs)-1] == final
		for i := 1; i < len(vs) && ok; i++ {
			// Next: the following change, or a rewind (a re-delivery).
			ok = vs[i] == vs[i-1]+1 || vs[i] <= vs[i-1]
		}
		if !ok {
			t.Fatalf("document %d: changes in partition order %v, want 0..%d in order (a rewind followed by every later change)", d, vs, final)
		}
		dups += len(vs) - (final + 1)
	}
	if refused.Load() == 0 {
		t.Fatal("the broker refused no produce request; the retry path was not exercised")
	}
	t.Logf("%d changes; %d records before SIGKILL, %d in all (%d re-delivered); %d of %d produce requests refused",
		total, before, len(recs), dups, refused.Load(), produces.Load())
}

// createTopic creates a topic on c with the given partitions and configs.
func createTopic(t *testing.T, c *kfake.Cluster, name string, partitions int32, configs map[string]string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, partitions, 1
	for k, v := range configs {
		rc := kmsg.NewCreateTopicsRequestTopicConfig()
		rc.Name, rc.Value = k, &v
		rt.Configs = append(rt.Configs, rc)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
}

// TestKafkaFailuresRetriedOrDeadLettered runs the gateway on a whole
// database with topic = "cdc.{db}.{coll}": a broker refusing the first
// produce requests with NOT_ENOUGH_REPLICAS is retried until every event of
// items is written; an event over the topic's max.message.bytes (read from
// the broker), one to a topic the sink may not write
// (TOPIC_AUTHORIZATION_FAILED) and one whose topic name Kafka refuses are
// dead-lettered at once with reasons that say so.
func TestKafkaFailuresRetriedOrDeadLettered(t *testing.T) {
	e := newEnv(t)
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	items, denied := "cdc."+e.db+".items", "cdc."+e.db+".denied"
	createTopic(t, c, items, 3, map[string]string{"max.message.bytes": "4096"})
	createTopic(t, c, denied, 1, nil)
	notEnough := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: items, Err: kerr.NotEnoughReplicas, Count: 4})
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: denied, Err: kerr.TopicAuthorizationFailed, Count: -1})
	kc := consumeKafka(t, c, items)

	tmpl := fmt.Sprintf(`
[mongo]
uri = "%%URI%%"
state_database = "%%STATE%%"

[server]
listen = "127.0.0.1:0"

[[sources]]
name = "db"
database = "%%DB%%"
checkpoint_interval = "100ms"
max_await = "200ms"

[[sinks]]
name = "cdc"
type = "kafka"
brokers = ["%s"]
topic = "cdc.{db}.{coll}"
  [sinks.retry]
  initial_interval = "20ms"
  max_interval = "100ms"

[[rules]]
name = "all"
source = "db"
sinks = ["cdc"]
`, strings.Join(c.ListenAddrs(), `", "`))
	cfg := e.config(tmpl)
	e.start(cfg)

	ctx := context.Background()
	insertN(t, e.coll("items"), 0, 20)
	if _, err := e.coll("items").InsertOne(ctx, bson.D{{Key: "_id", Value: 100}, {Key: "big", Value: strings.Repeat("x", 5000)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.coll("denied").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.coll("bad name").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	_, dls := e.stores(cfg)
	waitFor(t, 60*time.Second, "items delivered and three dead letters", func() bool {
		n, _ := dls.Count(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
		return len(kc.records()) >= 20 && n >= 3
	})

	docs := map[int]bool{}
	for _, r := range kc.records() {
		d, _ := version(t, r)
		docs[d] = true
	}
	if len(docs) != 20 || docs[100] {
		t.Fatalf("items: documents %v, want 0..19 (100 dead-lettered)", docs)
	}
	if notEnough.Hits() == 0 {
		t.Fatal("the NOT_ENOUGH_REPLICAS fault never fired")
	}
	entries, err := dls.List(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]deadletter.Entry{}
	for _, en := range entries {
		got[en.Reason] = en
	}
	if en, ok := got["oversize"]; !ok || !strings.Contains(en.LastError, "more than the request limit of 4096 bytes") || en.Attempts != 1 {
		t.Errorf("oversize dead letter: %+v", en)
	}
	if en, ok := got["topic_authorization_failed"]; !ok || en.Attempts != 1 {
		t.Errorf("authorization dead letter: %+v", en)
	}
	if en, ok := got["invalid_topic"]; !ok || !strings.Contains(en.LastError, `"cdc.`+e.db+`.bad name"`) {
		t.Errorf("invalid topic dead letter: %+v", en)
	}
	if len(entries) != 3 {
		var reasons []string
		for _, en := range entries {
			reasons = append(reasons, en.Reason)
		}
		t.Fatalf("dead letters %v, want oversize, topic_authorization_failed, invalid_topic", reasons)
	}
}
