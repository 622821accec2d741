package e2e

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	awstest "github.com/changegate/changegate/test/aws"
)

// streamsConfig routes every change of %DB%.items to a Kinesis stream and
// an SNS FIFO topic.
func streamsConfig(kinesisURL, topicARN, snsURL string) string {
	return itemsHead + fmt.Sprintf(`
[[sinks]]
name = "stream"
type = "kinesis"
stream = "changes"
endpoint = %q
max_in_flight = 4
  [sinks.retry]
  max_attempts = 30
  initial_interval = "20ms"
  max_interval = "200ms"

[[sinks]]
name = "fanout"
type = "sns"
topic_arn = %q
endpoint = %q
max_in_flight = 4
  [sinks.retry]
  max_attempts = 30
  initial_interval = "20ms"
  max_interval = "200ms"

[[rules]]
name = "streams"
source = "items"
sinks = ["stream", "fanout"]
`, kinesisURL, topicARN, snsURL)
}

// rank is the position of an envelope's change among its document's
// changes as changeDocs makes them: insert 0, first update 1, second 2.
func rank(v envelope) int {
	if v.Update.Fields.N != nil {
		return *v.Update.Fields.N / 1000
	}
	return 0
}

// flaky fails the first attempt of some changes: it returns a failure for
// about a third of the events (one in five throttled, one in seven an
// internal failure), the first time each is offered.
type flaky struct {
	mu    sync.Mutex
	tries map[string]int
	hits  int
}

func (f *flaky) first(id string, throttle, internal string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries[id]++
	if f.tries[id] > 1 {
		return ""
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	switch n := h.Sum32(); {
	case n%5 == 0:
		f.hits++
		return throttle
	case n%7 == 0:
		f.hits++
		return internal
	}
	return ""
}

// checkEpochOrder checks that within envs (one run of the process, in the
// order the service stored them), each document's changes never go back:
// a run re-delivers from its checkpoint, so it may repeat a change, never
// put an earlier one after a later one.
func checkEpochOrder(t *testing.T, what string, envs []envelope) {
	t.Helper()
	last := map[int]int{}
	for _, v := range envs {
		id := v.DocumentKey.ID
		if r, ok := last[id]; ok && rank(v) < r {
			t.Fatalf("%s: document %d: change %d after change %d", what, id, rank(v), r)
		}
		last[id] = rank(v)
	}
}

// TestProcessKinesisAndSNSSIGKILLKeepDocumentOrder runs the real binary with
// a Kinesis sink and an SNS FIFO sink while both services fail a third of
// the records or messages once (throttled or internal failure, retried
// alone), kills it with SIGKILL in the middle of the stream and restarts
// it: every change arrives, each document's changes are in order in every
// run on the stream (a run re-sends from the checkpoint), and the FIFO
// topic holds each change exactly once (re-sends are deduplicated by their
// stable MessageDeduplicationId), in order per document.
func TestProcessKinesisAndSNSSIGKILLKeepDocumentOrder(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := changegateBinary(t)
	awsEnv(t)
	e := newEnv(t)
	kin := awstest.NewKinesis(awstest.Options{})
	t.Cleanup(kin.Close)
	kin.CreateStreamWith("changes", awstest.StreamOptions{Shards: 4})
	topics := awstest.NewSNS(awstest.Options{})
	t.Cleanup(topics.Close)
	arn := topics.CreateTopic("changes.fifo")

	kf, sf := &flaky{tries: map[string]int{}}, &flaky{tries: map[string]int{}}
	// The callbacks run on the servers' goroutines: no t.Fatal there.
	idOf := func(b []byte) string {
		var v envelope
		_ = json.Unmarshal(b, &v)
		return v.ID
	}
	kin.FailRecords(func(r awstest.Record) (string, string) {
		return kf.first(idOf(r.Data), "ProvisionedThroughputExceededException", "InternalFailure"), "injected"
	})
	topics.FailEntries(func(m awstest.SNSMessage) (string, string, bool) {
		return sf.first(idOf([]byte(m.Message)), "Throttled", "InternalError"), "injected", false
	})

	tmpl := streamsConfig(kin.URL(), arn, topics.URL())
	cfgPath := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(cfgPath, []byte(e.expand(tmpl)), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, bin, cfgPath)
	cps, _ := e.stores(e.config(tmpl))
	waitFor(t, 20*time.Second, "the process to open its stream", func() bool {
		_, ok, _ := cps.Load(t.Context(), "items")
		return ok
	})
	const docs, updated = 800, 200
	const want = docs + 2*updated
	writeErr := make(chan error, 1)
	go func() { writeErr <- changeDocs(e.coll("items"), docs, updated) }()
	waitFor(t, 60*time.Second, "some records on the stream", func() bool { return len(kin.Records("changes")) > 150 })
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.cmd.Wait()
	before := len(kin.Records("changes"))
	if err := <-writeErr; err != nil {
		t.Fatal(err)
	}
	if before >= want {
		t.Fatalf("everything was on the stream before SIGKILL; the test proves nothing")
	}

	p = startProcess(t, bin, cfgPath)
	distinct := func(envs []envelope) int {
		ids := map[string]bool{}
		for _, v := range envs {
			ids[v.ID] = true
		}
		return len(ids)
	}
	envsOf := func() (stream, topic []envelope) {
		for _, r := range kin.Records("changes") {
			stream = append(stream, parseEnvelope(t, string(r.Data)))
		}
		for _, m := range topics.Messages("changes.fifo") {
			topic = append(topic, parseEnvelope(t, m.Message))
		}
		return stream, topic
	}
	waitFor(t, 90*time.Second, "every change on the stream and the topic", func() bool {
		stream, topic := envsOf()
		return distinct(stream) >= want && distinct(topic) >= want
	})
	stream, topic := envsOf()
	checkEpochOrder(t, "kinesis before SIGKILL", stream[:before])
	checkEpochOrder(t, "kinesis after restart", stream[before:])
	if len(topic) != want {
		t.Fatalf("sns FIFO topic holds %d messages, want %d (one per change, re-sends deduplicated)", len(topic), want)
	}
	checkDocOrder(t, "sns", topic, updated)

	// Records of one document share a partition key, hence a shard.
	shards := map[int]string{}
	for _, r := range kin.Records("changes") {
		id := parseEnvelope(t, string(r.Data)).DocumentKey.ID
		if s, ok := shards[id]; ok && s != r.ShardID {
			t.Fatalf("document %d on shards %s and %s", id, s, r.ShardID)
		}
		shards[id] = r.ShardID
	}
	if kin.Rejected() != 0 || topics.Rejected() != 0 {
		t.Fatalf("requests rejected by SigV4 verification: kinesis %d, sns %d", kin.Rejected(), topics.Rejected())
	}
	kf.mu.Lock()
	sf.mu.Lock()
	if kf.hits == 0 || sf.hits == 0 {
		t.Errorf("no failure injected (kinesis %d, sns %d): the test proves less than it says", kf.hits, sf.hits)
	}
	t.Logf("%d changes; kinesis: %d records before SIGKILL, %d in all, %d failed once; sns: %d duplicates dropped, %d failed once",
		want, before, len(stream), kf.hits, topics.Duplicates("changes.fifo"), sf.hits)
	kf.mu.Unlock()
	sf.mu.Unlock()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.out)
	}
}
