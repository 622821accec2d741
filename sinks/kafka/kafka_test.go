package kafka

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/sinktest"
)

const topic = "cdc.shop.orders"

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, topic)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newSink(t *testing.T, c *kfake.Cluster, mod func(*Config)) *Kafka {
	t.Helper()
	return sinktest.Open(t, New, Config{Name: "k", Brokers: c.ListenAddrs(), Topic: "cdc.{db}.{coll}", Timeout: 5 * time.Second}, mod)
}

// change builds a change event of document id, numbered n.
func change(t testing.TB, n int, id any, op, coll string, padding int) *event.Event {
	t.Helper()
	ns := bson.D{{Key: "db", Value: "shop"}}
	if coll != "" {
		ns = append(ns, bson.E{Key: "coll", Value: coll})
	}
	doc := bson.D{
		{Key: "_id", Value: bson.D{{Key: "_data", Value: fmt.Sprintf("82%08X", n)}}},
		{Key: "operationType", Value: op},
		{Key: "clusterTime", Value: bson.Timestamp{T: uint32(1_700_000_000 + n), I: 1}},
		{Key: "ns", Value: ns},
	}
	if id != nil {
		doc = append(doc, bson.E{Key: "documentKey", Value: bson.D{{Key: "_id", Value: id}}},
			bson.E{Key: "fullDocument", Value: bson.D{{Key: "_id", Value: id}, {Key: "n", Value: n}, {Key: "pad", Value: strings.Repeat("x", padding)}}})
	}
	e := sinktest.FromDoc(t, "orders", n, doc)
	e.Rules = []string{"r"}
	return e
}

// consume reads every record of topics until want records arrived.
func consume(t *testing.T, c *kfake.Cluster, want int, topics ...string) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for len(recs) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d records of %v, want %d", len(recs), topics, want)
		}
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	// Nothing more: a short poll finds no further record.
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	cl.PollFetches(short).EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	return recs
}

func header(r *kgo.Record, k string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value), true
		}
	}
	return "", false
}

// TestSendRecords: topic, key, value and headers of each record; a
// document's records land in one partition, in the order sent.
func TestSendRecords(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, nil)
	var evs []*event.Event
	for i := range 6 {
		evs = append(evs, change(t, i, i, "insert", "orders", 10))
	}
	if err := k.Send(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	// Three more changes of document 1, one Send each.
	for n := 10; n < 13; n++ {
		if err := k.Send(t.Context(), []*event.Event{change(t, n, 1, "update", "orders", 0)}); err != nil {
			t.Fatal(err)
		}
	}
	recs := consume(t, c, 9, topic)
	if len(recs) != 9 {
		t.Fatalf("%d records, want 9", len(recs))
	}
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		id, _ := header(r, HeaderID)
		byID[id] = r
	}
	for _, e := range evs {
		r := byID[e.ID]
		if r == nil {
			t.Fatalf("no record for %s", e.ID)
		}
		env, _ := e.Envelope(false)
		if r.Topic != topic || !bytes.Equal(r.Value, env) {
			t.Fatalf("record %s: topic %s value %s", e.ID, r.Topic, r.Value)
		}
		wantKey := fmt.Sprintf(`{"_id":{"$numberInt":"%d"}}`, e.Seq)
		if string(r.Key) != wantKey {
			t.Fatalf("key %s, want %s", r.Key, wantKey)
		}
		want := []string{
			"id=" + e.ID, "source=orders", "operationType=insert", "ns=shop.orders",
			fmt.Sprintf(`documentKey={"_id":%d}`, e.Seq),
			"clusterTime=" + time.Unix(int64(1_700_000_000+e.Seq), 0).UTC().Format(time.RFC3339),
		}
		var got []string
		for _, h := range r.Headers {
			got = append(got, h.Key+"="+string(h.Value))
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("headers\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	// Document 1: insert then updates 10, 11, 12, all in one partition.
	var ops []string
	part := int32(-1)
	for _, r := range recs {
		if string(r.Key) != `{"_id":{"$numberInt":"1"}}` {
			continue
		}
		if part >= 0 && r.Partition != part {
			t.Fatalf("document 1 in partitions %d and %d", part, r.Partition)
		}
		part = r.Partition
		id, _ := header(r, HeaderID)
		ops = append(ops, id)
	}
	want := []string{evs[1].ID}
	for n := 10; n < 13; n++ {
		want = append(want, change(t, n, 1, "update", "orders", 0).ID)
	}
	if strings.Join(ops, ",") != strings.Join(want, ",") {
		t.Fatalf("document 1: %v, want %v", ops, want)
	}
}

// TestKeyCanonical: the key keeps the BSON type, so one document always
// hashes to the same partition; an event without a document key has none.
func TestKeyCanonical(t *testing.T) {
	oid := bson.ObjectID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	for _, tc := range []struct {
		id   any
		want string
	}{
		{int32(7), `{"_id":{"$numberInt":"7"}}`},
		{int64(7), `{"_id":{"$numberLong":"7"}}`},
		{"a", `{"_id":"a"}`},
		{oid, `{"_id":{"$oid":"0102030405060708090a0b0c"}}`},
	} {
		if got := string(Key(change(t, 1, tc.id, "update", "orders", 0))); got != tc.want {
			t.Errorf("Key(%v) = %s, want %s", tc.id, got, tc.want)
		}
	}
	if k := Key(change(t, 1, nil, "drop", "orders", 0)); k != nil {
		t.Errorf("drop: key %s, want none", k)
	}
}

// TestTopicTemplate: {db}, {coll} and {source} expand per event; an event
// whose topic Kafka would refuse fails permanently, the others go.
func TestTopicTemplate(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "orders.shop.items", "orders.shop.orders"))
	k := newSink(t, c, func(cfg *Config) { cfg.Topic = "{source}.{db}.{coll}" })
	evs := []*event.Event{
		change(t, 1, 1, "insert", "items", 0),
		change(t, 2, 1, "insert", "my items", 0),
		change(t, 3, 1, "insert", "orders", 0),
	}
	err := k.Send(t.Context(), evs)
	var be *sinks.BatchError
	var de *sinks.Error
	if !errors.As(err, &be) || len(be.Failed) != 1 || !errors.As(be.Failed[1], &de) || !de.Permanent || de.Reason != "invalid_topic" {
		t.Fatalf("err = %v, want entry 1 failed permanently (invalid_topic)", err)
	}
	recs := consume(t, c, 2, "orders.shop.items", "orders.shop.orders")
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	got := map[string]string{}
	for _, r := range recs {
		id, _ := header(r, HeaderID)
		got[id] = r.Topic
	}
	if got[evs[0].ID] != "orders.shop.items" || got[evs[2].ID] != "orders.shop.orders" {
		t.Fatalf("topics %v", got)
	}

	for _, bad := range []string{"", "x.{operationType}", "a b", "{db", "x}"} {
		if _, err := CompileTopic(bad); err == nil {
			t.Errorf("CompileTopic(%q) succeeded", bad)
		}
	}
}

// failProduce answers every produce request with code for every partition
// while on is true.
func failProduce(c *kfake.Cluster, code int16, on *atomic.Bool, calls *atomic.Int32) {
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !on.Load() {
			return nil, nil, false
		}
		calls.Add(1)
		pr := req.(*kmsg.ProduceRequest)
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

// TestRetryableBrokerError: a broker answering NOT_ENOUGH_REPLICAS fails
// the batch as retryable once the client's own tries are spent; the same
// batch sent again after the broker recovers is written once, in order.
func TestRetryableBrokerError(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, nil)
	var on atomic.Bool
	var calls atomic.Int32
	on.Store(true)
	failProduce(c, kerr.NotEnoughReplicas.Code, &on, &calls)

	evs := []*event.Event{change(t, 1, 1, "insert", "orders", 0), change(t, 2, 2, "insert", "orders", 0)}
	err := k.Send(t.Context(), evs)
	var de *sinks.Error
	if !errors.As(err, &de) || de.Permanent || de.Reason != "not_enough_replicas" {
		t.Fatalf("err = %#v, want retryable not_enough_replicas", err)
	}
	if n := calls.Load(); n < 1 || n > RecordRetries*2 {
		t.Fatalf("%d produce requests, want between 1 and %d (the client's own tries only)", n, RecordRetries*2)
	}
	on.Store(false)
	if err := k.Send(t.Context(), evs); err != nil {
		t.Fatal(err)
	}
	recs := consume(t, c, 2, topic)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2 (each once)", len(recs))
	}
}

// TestPartialFailureNamesTheFailedEntries: with one partition refusing
// records, exactly the events whose records went there are reported failed,
// and every other one is in the topic. (The client returns results in the
// order records finish: the failed ones, retried, finish last.)
func TestPartialFailureNamesTheFailedEntries(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, nil)
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{0}, Err: kerr.NotEnoughReplicas, Count: -1})
	var evs []*event.Event
	for i := range 30 {
		evs = append(evs, change(t, i, i, "insert", "orders", 0))
	}
	err := k.Send(t.Context(), evs)
	var be *sinks.BatchError
	if !errors.As(err, &be) || len(be.Failed) == 0 || len(be.Failed) == len(evs) {
		t.Fatalf("err = %v, want some entries failed", err)
	}
	if h.Hits() == 0 {
		t.Fatal("the fault never fired")
	}
	recs := consume(t, c, len(evs)-len(be.Failed), topic)
	delivered := map[string]bool{}
	for _, r := range recs {
		id, _ := header(r, HeaderID)
		delivered[id] = true
		if r.Partition == 0 {
			t.Fatalf("record %s in the refusing partition", id)
		}
	}
	for i, e := range evs {
		_, failed := be.Failed[i]
		if failed == delivered[e.ID] {
			t.Fatalf("event %d (%s): reported failed %v, in the topic %v", i, e.ID, failed, delivered[e.ID])
		}
	}
}

// TestPermanentBrokerError: TOPIC_AUTHORIZATION_FAILED and POLICY_VIOLATION
// are permanent; UNKNOWN_TOPIC_OR_PARTITION is retryable.
func TestPermanentBrokerError(t *testing.T) {
	for _, tc := range []struct {
		err       *kerr.Error
		permanent bool
	}{
		{kerr.TopicAuthorizationFailed, true},
		{kerr.PolicyViolation, true},
		{kerr.InvalidRecord, true},
		{kerr.MessageTooLarge, false},
		{kerr.NotLeaderForPartition, false},
	} {
		t.Run(tc.err.Message, func(t *testing.T) {
			c := newCluster(t)
			k := newSink(t, c, nil)
			h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Err: tc.err, Count: -1})
			err := k.Send(t.Context(), []*event.Event{change(t, 1, 1, "insert", "orders", 0)})
			var de *sinks.Error
			if !errors.As(err, &de) || de.Permanent != tc.permanent || de.Reason != strings.ToLower(tc.err.Message) {
				t.Fatalf("err = %v, want permanent=%v reason %s", err, tc.permanent, strings.ToLower(tc.err.Message))
			}
			if h.Hits() == 0 {
				t.Fatal("the fault never fired")
			}
		})
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err       error
		permanent bool
		reason    string
		code      string // the broker's error name
	}{
		{kerr.UnknownTopicOrPartition, false, "unknown_topic_or_partition", "UNKNOWN_TOPIC_OR_PARTITION"},
		{fmt.Errorf("wrapped: %w", kerr.ClusterAuthorizationFailed), true, "cluster_authorization_failed", "CLUSTER_AUTHORIZATION_FAILED"},
		{kerr.SaslAuthenticationFailed, false, "sasl_authentication_failed", "SASL_AUTHENTICATION_FAILED"},
		{kerr.InvalidProducerEpoch, false, "invalid_producer_epoch", "INVALID_PRODUCER_EPOCH"},
		{context.DeadlineExceeded, false, "timeout", ""},
		{kgo.ErrRecordTimeout, false, "timeout", ""},
		{kgo.ErrClientClosed, false, "closed", ""},
		{&netErr{}, false, "transport", ""},
		{errors.New("odd"), false, "error", ""},
	} {
		de := Classify("kafka k", "orders:1", tc.err)
		if de.Permanent != tc.permanent || de.Reason != tc.reason || de.Code != tc.code || !errors.Is(de, tc.err) {
			t.Errorf("Classify(%v) = permanent %v reason %s code %q, want %v %s %q", tc.err, de.Permanent, de.Reason, de.Code, tc.permanent, tc.reason, tc.code)
		}
	}
}

type netErr struct{}

func (*netErr) Error() string   { return "connection refused" }
func (*netErr) Timeout() bool   { return false }
func (*netErr) Temporary() bool { return false }

// TestOversize: a record over the topic's max.message.bytes (lower than
// max_request_bytes), read from the broker, is refused before sending, reason oversize, or sent
// stripped with oversize = "strip"; the other records of the batch go.
func TestOversize(t *testing.T) {
	c := newCluster(t)
	for _, strip := range []bool{false, true} {
		t.Run(fmt.Sprint("strip=", strip), func(t *testing.T) {
			var refused, strippedN counter
			k := newSink(t, c, func(cfg *Config) {
				cfg.Oversize = sinks.Oversize{Strip: strip, Refused: &refused, Stripped: &strippedN}
				cfg.Topic = "cdc.{db}.{coll}." + fmt.Sprint(strip)
			})
			name := "cdc.shop.orders." + fmt.Sprint(strip)
			if _, err := kadmCreate(c, name); err != nil {
				t.Fatal(err)
			}
			if got := k.TopicLimit(t.Context(), name); got != 4096 {
				t.Fatalf("TopicLimit = %d, want the broker's 4096", got)
			}
			evs := []*event.Event{change(t, 1, 1, "insert", "orders", 10), change(t, 2, 2, "insert", "orders", 8000)}
			err := k.Send(t.Context(), evs)
			if strip {
				if err != nil {
					t.Fatal(err)
				}
				recs := consume(t, c, 2, name)
				if len(recs) != 2 || strippedN.n.Load() != 1 {
					t.Fatalf("%d records, %d stripped", len(recs), strippedN.n.Load())
				}
				for _, r := range recs {
					if id, _ := header(r, HeaderID); id == evs[1].ID && !bytes.Contains(r.Value, []byte(`"truncated":true`)) {
						t.Fatalf("record %s not stripped: %.200s", id, r.Value)
					}
				}
				return
			}
			var be *sinks.BatchError
			var de *sinks.Error
			if !errors.As(err, &be) || len(be.Failed) != 1 || !errors.As(be.Failed[1], &de) || !de.Permanent || de.Reason != "oversize" {
				t.Fatalf("err = %v, want entry 1 oversize", err)
			}
			if !strings.Contains(de.Error(), "4096 bytes") || refused.n.Load() != 1 {
				t.Fatalf("message %q, refused %d", de.Error(), refused.n.Load())
			}
			if recs := consume(t, c, 1, name); len(recs) != 1 {
				t.Fatalf("%d records, want 1", len(recs))
			}
		})
	}
}

type counter struct{ n atomic.Int64 }

func (c *counter) Inc() { c.n.Add(1) }

// kadmCreate creates a topic with one partition and max.message.bytes =
// 4096.
func kadmCreate(c *kfake.Cluster, name string) (*kmsg.CreateTopicsResponse, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, 1, 1
	limit := "4096"
	rc := kmsg.NewCreateTopicsRequestTopicConfig()
	rc.Name, rc.Value = "max.message.bytes", &limit
	rt.Configs = append(rt.Configs, rc)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), cl)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	return resp, err
}

// TestSASL: SCRAM-SHA-256 credentials authenticate; wrong ones fail
// retryably (credentials may be rotating).
func TestSASL(t *testing.T) {
	c := newCluster(t, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "cg", "s3cret"))
	k := newSink(t, c, func(cfg *Config) {
		cfg.SASLMechanism, cfg.SASLUsername, cfg.SASLPassword = SASLScramSHA256, "cg", "s3cret"
	})
	if err := k.Send(t.Context(), []*event.Event{change(t, 1, 1, "insert", "orders", 0)}); err != nil {
		t.Fatal(err)
	}
	bad := newSink(t, c, func(cfg *Config) {
		cfg.SASLMechanism, cfg.SASLUsername, cfg.SASLPassword = SASLScramSHA256, "cg", "wrong"
		cfg.Timeout = 2 * time.Second
	})
	err := bad.Send(t.Context(), []*event.Event{change(t, 2, 2, "insert", "orders", 0)})
	var de *sinks.Error
	if !errors.As(err, &de) || de.Permanent {
		t.Fatalf("err = %v, want retryable", err)
	}
}

// TestConfigErrors: New reports every problem at once.
func TestConfigErrors(t *testing.T) {
	_, err := New(Config{Name: "k", Brokers: []string{"nohost"}, Topic: "a{operationType}",
		MaxRequestBytes: 10, TLSCAFile: "/x", SASLMechanism: "GSSAPI", SASLUsername: "u", SASLPassword: "p"}, nil)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`kafka k: brokers: "nohost" is not host:port`, "topic: unknown placeholder {operationType}",
		"max_request_bytes must be between", "need tls = true", `sasl_mechanism "GSSAPI"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := New(Config{Brokers: []string{"h:9092"}}, nil); err == nil || !strings.Contains(err.Error(), "topic: must not be empty") {
		t.Errorf("err = %v", err)
	}
}

// TestCancelled: a Send whose context ends returns the context's error, not
// a delivery failure.
func TestCancelled(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, nil)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return nil, nil, true // never answered
	})
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := k.Send(ctx, []*event.Event{change(t, 1, 1, "insert", "orders", 0)})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's", err)
	}
	var de *sinks.Error
	if errors.As(err, &de) {
		t.Fatalf("err = %v is a delivery failure", err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("Send took %s after its context ended", d)
	}
}

// TestTLS: with tls = true and the broker's CA in tls_ca_file the sink
// produces over TLS; without the CA the certificate is refused (retryable:
// the connection failed).
func TestTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kfake"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}))

	k := newSink(t, c, func(cfg *Config) { cfg.TLS, cfg.TLSCAFile = true, caFile })
	if err := k.Send(t.Context(), []*event.Event{change(t, 1, 1, "insert", "orders", 0)}); err != nil {
		t.Fatal(err)
	}
	untrusted := newSink(t, c, func(cfg *Config) { cfg.TLS, cfg.Timeout = true, 2*time.Second })
	err = untrusted.Send(t.Context(), []*event.Event{change(t, 2, 2, "insert", "orders", 0)})
	var de *sinks.Error
	if !errors.As(err, &de) || de.Permanent {
		t.Fatalf("err = %v, want a retryable failure", err)
	}
}
