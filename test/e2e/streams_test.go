package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/deadletter"
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
	// Each run tags its requests (User-Agent "app/run1", "app/run2"): a
	// request the killed run had sent may still be written after it died,
	// so the stream's order alone does not tell the runs apart.
	t.Setenv("AWS_SDK_UA_APP_ID", "run1")
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

	t.Setenv("AWS_SDK_UA_APP_ID", "run2")
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
	var runs [2][]envelope
	for i, r := range kin.Records("changes") {
		switch {
		case strings.Contains(r.UserAgent, "app/run1"):
			runs[0] = append(runs[0], stream[i])
		case strings.Contains(r.UserAgent, "app/run2"):
			runs[1] = append(runs[1], stream[i])
		default:
			t.Fatalf("record %d from neither run: User-Agent %q", i, r.UserAgent)
		}
	}
	checkEpochOrder(t, "kinesis, the killed run", runs[0])
	checkEpochOrder(t, "kinesis, the restarted run", runs[1])
	// A consumer that skips the ids it has seen sees every document's
	// changes once, in order: a run sends a change only after the earlier
	// one was written, so whatever a run writes late, its predecessors are
	// already on the stream.
	seen := map[string]bool{}
	var firsts []envelope
	for _, v := range stream {
		if !seen[v.ID] {
			seen[v.ID] = true
			firsts = append(firsts, v)
		}
	}
	checkDocOrder(t, "kinesis, first occurrences", firsts, updated)
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
	t.Logf("%d changes; kinesis: %d records at SIGKILL, %d from the killed run, %d in all, %d failed once; sns: %d duplicates dropped, %d failed once",
		want, before, len(runs[0]), len(stream), kf.hits, topics.Duplicates("changes.fifo"), sf.hits)
	kf.mu.Unlock()
	sf.mu.Unlock()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, p.out)
	}
}

// TestKinesisAndSNSFailuresRetriedOrDeadLettered: whole-call throttling and
// failed records are retried (only the failed records are re-sent); a
// record or message the service refuses for good and an oversize event are
// dead-lettered at once with a reason that says so; the metrics and the
// console show both sinks.
func TestKinesisAndSNSFailuresRetriedOrDeadLettered(t *testing.T) {
	awsEnv(t)
	e := newEnv(t)
	kin := awstest.NewKinesis(awstest.Options{})
	t.Cleanup(kin.Close)
	kin.CreateStream("changes")
	topics := awstest.NewSNS(awstest.Options{})
	t.Cleanup(topics.Close)
	arn := topics.CreateTopic("changes")

	docOf := func(b []byte) int {
		var v envelope
		_ = json.Unmarshal(b, &v)
		return v.DocumentKey.ID
	}
	var mu sync.Mutex
	tries := map[int]int{}
	kin.Throttle(2)
	kin.FailRecords(func(r awstest.Record) (string, string) {
		id := docOf(r.Data)
		mu.Lock()
		defer mu.Unlock()
		tries[id]++
		switch {
		case id == 3 && tries[id] == 1:
			return "ProvisionedThroughputExceededException", "Rate exceeded for shard " + r.ShardID
		case id == 5:
			return "KMSAccessDeniedException", "no access to the stream's key"
		}
		return "", ""
	})
	topics.FailEntries(func(m awstest.SNSMessage) (string, string, bool) {
		if docOf([]byte(m.Message)) == 4 {
			return "InvalidParameter", "Invalid parameter: Message", true
		}
		return "", "", false
	})
	tmpl := strings.ReplaceAll(streamsConfig(kin.URL(), arn, topics.URL()), "max_in_flight = 4\n", "max_in_flight = 4\nmax_request_bytes = 2048\n")
	cfg := e.config(tmpl)
	cfg.Server.PublicRead = true // the test reads /ui/ and /metrics without a token
	cfg.Server.ConsoleAuth = config.ConsoleAuthNone
	g := e.start(cfg)

	c := e.coll("items")
	insertN(t, c, 0, 20)
	if _, err := c.InsertOne(context.Background(), bson.D{{Key: "_id", Value: 100}, {Key: "big", Value: strings.Repeat("x", 4096)}}); err != nil {
		t.Fatal(err)
	}
	_, dls := e.stores(cfg)
	ctx := context.Background()
	waitFor(t, 30*time.Second, "deliveries and dead letters", func() bool {
		n, _ := dls.Count(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
		return len(kin.Records("changes")) >= 19 && len(topics.Messages("changes")) >= 19 && n >= 4
	})

	seen := map[int]int{}
	for _, r := range kin.Records("changes") {
		seen[docOf(r.Data)]++
	}
	for id, n := range seen {
		if n != 1 || id == 5 || id == 100 {
			t.Fatalf("kinesis: document %d written %d times", id, n)
		}
	}
	mu.Lock()
	if tries[3] != 2 || tries[4] != 1 {
		t.Errorf("record attempts: document 3 %d (want 2), document 4 %d (want 1: not re-sent)", tries[3], tries[4])
	}
	mu.Unlock()
	entries, err := dls.List(ctx, deadletter.Filter{Kind: deadletter.KindFailed})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, en := range entries {
		got[fmt.Sprintf("%s:%s:%t", en.Sink, en.Reason, strings.Contains(en.LastError, "more than the request limit of 2048 bytes") || en.Reason != "oversize")] = true
	}
	for _, w := range []string{"stream:KMSAccessDeniedException:true", "stream:oversize:true", "fanout:InvalidParameter:true", "fanout:oversize:true"} {
		if !got[w] {
			t.Errorf("dead letter %s missing; got %v", w, got)
		}
	}
	if len(entries) != 4 {
		t.Fatalf("%d dead letters %v, want 4", len(entries), got)
	}

	get := func(path string) string {
		resp, err := http.Get("http://" + g.admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	metrics := get("/metrics")
	for _, m := range []string{
		`changegate_delivery_failures_total{reason="throttled",sink="stream"}`,
		`changegate_delivery_failures_total{reason="KMSAccessDeniedException",sink="stream"} 1`,
		`changegate_delivery_failures_total{reason="InvalidParameter",sink="fanout"} 1`,
		`changegate_delivery_failures_total{reason="oversize",sink="fanout"} 1`,
	} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	ui := get("/ui/")
	for _, s := range []string{`class="sink health-`, `data-name="stream"`, `data-name="fanout"`} {
		if !strings.Contains(ui, s) {
			t.Errorf("console overview lacks %s", s)
		}
	}
}
