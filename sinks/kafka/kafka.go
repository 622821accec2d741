// Package kafka is the sink that produces events to Apache Kafka topics with
// github.com/twmb/franz-go.
//
// Each event becomes one record:
//
//   - Topic: Config.Topic, a template with {db}, {coll} and {source}
//     (see Topic). An expanded name Kafka would refuse (a collection
//     name with a space, say) fails the event permanently, reason
//     "invalid_topic".
//   - Key: the document key as canonical Extended JSON, e.g.
//     {"_id":{"$oid":"..."}} (see Key). Canonical keeps the BSON type, so
//     one document always has the same key bytes, and the partitioner
//     (franz-go's default: murmur2 of the key, as the Java client) always
//     picks the same partition for it. Events without a document key (drop,
//     rename, dropDatabase) have a null key.
//   - Value: the event's JSON envelope, the bytes a webhook receives (with
//     envelope = "document", the post-image alone).
//   - Headers: "id", "source", "operationType", "ns" (db.coll),
//     "documentKey" (relaxed Extended JSON), "clusterTime" (RFC 3339) and
//     "txn" (the envelope's txn object, for an event of a multi-document
//     transaction), those the event has.
//
// # Producer and order
//
// The producer is idempotent with acks = all (franz-go's defaults, kept
// explicitly): the broker drops a batch it already wrote when the client
// re-sends it after a lost answer, and keeps a partition's batches in the
// order of their sequence numbers, with up to 5 produce requests in flight
// per broker. Per-document order is kept because
//
//   - the engine hands Send at most one event per document and sends a
//     document's next event only once Send reported the previous one
//     delivered (ordering = "key" or "strict");
//   - a document's records all go to one topic and one partition (the topic
//     template has no per-operation placeholder, and the key is stable);
//   - when the client gives a record up (its retries exhausted, the
//     Send timeout, a cancelled Send), it fails every record buffered for
//     that partition too (franz-go's gapless ordering), and before producing
//     again bumps its idempotent producer epoch (KIP-360, Kafka 2.5+). A
//     request still in flight under the old epoch is then either written
//     before the retry, or refused by the broker once the new epoch was
//     seen: a record is written at most once more, never after a later
//     change of its document. This needs Kafka 2.5 or later.
//
// The client retries a failed produce itself at most RecordRetries times
// in all, and never longer than the Send's timeout
// (AllowIdempotentProduceCancellation lets it give up an in-flight request,
// at the cost of a possible duplicate, which at-least-once allows); the
// engine's retry policy, backoff, parking and dead letters do the rest.
//
// # Size
//
// A record batch must fit the topic's max.message.bytes. Before the first
// record to a topic Send asks the broker for it (DescribeConfigs) and uses
// the smaller of it and Config.MaxRequestBytes (default 1,000,012 bytes,
// franz-go's default and the topic default of older brokers, below the
// 1,048,588 of current ones) both as the client's batch limit for the topic
// (ProducerBatchMaxBytesFn) and as the limit of one record; without the
// permission to read it, MaxRequestBytes alone applies. A record whose key,
// value and headers with the record-batch overhead exceed the limit fails
// permanently with reason "oversize", or, with Config.Oversize.Strip, goes
// stripped (sinks.Oversize.Fit).
//
// # Failures
//
// Send returns nil when every record was written, a *sinks.BatchError when
// some failed, and a *sinks.Error when all failed alike. A broker error's
// reason is its name in franz-go's kerr in lower case ("not_enough_replicas",
// "topic_authorization_failed", "not_leader_for_partition" for what Kafka
// now calls NOT_LEADER_OR_FOLLOWER). Permanent (the record itself is refused,
// or the sink may not write to the topic; retrying cannot help):
// INVALID_RECORD, CORRUPT_MESSAGE, INVALID_TIMESTAMP,
// INVALID_TOPIC_EXCEPTION, POLICY_VIOLATION, UNSUPPORTED_FOR_MESSAGE_FORMAT,
// TOPIC_AUTHORIZATION_FAILED and CLUSTER_AUTHORIZATION_FAILED (as the AWS
// sinks treat AccessDenied), and a topic name Kafka refuses
// ("invalid_topic", before sending). Everything else is retryable:
// retriable broker errors (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS,
// REQUEST_TIMED_OUT...); MESSAGE_TOO_LARGE and RECORD_LIST_TOO_LARGE (the
// broker refuses a whole batch, which may hold records of other documents
// and other Sends; an oversize record is refused before sending, so these
// mean the topic's limit was lowered since it was read); UNKNOWN_TOPIC_OR_PARTITION
// (the topic may be being created: the backlog parks rather than
// dead-letters); SASL authentication failures (credentials being rotated);
// producer-id errors the client recovers from; connection failures
// ("transport") and the Send timeout ("timeout").
package kafka

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/confcheck"
	"github.com/changegate/changegate/tracing"
)

// Limits and defaults.
const (
	// MaxRecords is the most events one Send takes.
	MaxRecords = 1000
	// DefaultMaxRequestBytes is the default record batch limit, franz-go's
	// default ProducerBatchMaxBytes (Kafka's historical max.message.bytes).
	DefaultMaxRequestBytes = 1000012
	// MaxRequestBytesLimit is the largest batch limit franz-go accepts.
	MaxRequestBytesLimit = 1 << 30
	// minRequestBytes is the smallest batch limit franz-go accepts.
	minRequestBytes = 512
	// DefaultTimeout bounds one Send when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// RecordRetries is how many times in all the client tries a record
	// (franz-go's RecordRetries): transport-level retries within one Send.
	RecordRetries = 3
	// metadataMinAge is the client's least interval between metadata
	// refreshes.
	metadataMinAge = 500 * time.Millisecond
)

// Record overhead counted against MaxRequestBytes, an upper bound of what
// franz-go counts (a record batch's header and length, a record's
// attributes, timestamp and offset deltas and length varints, and each
// header's length varints).
const (
	batchOverhead  = 80
	recordOverhead = 40
	headerOverhead = 10
)

// SASL mechanisms of Config.SASLMechanism, as Kafka names them.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Record header names.
const (
	HeaderID            = "id"
	HeaderSource        = "source"
	HeaderOperationType = "operationType"
	HeaderNS            = "ns"
	HeaderDocumentKey   = "documentKey"
	HeaderClusterTime   = "clusterTime"
	HeaderTxn           = "txn"
)

// Config configures a Kafka sink.
type Config struct {
	// Name is the sink name, used in errors, logs and the client id.
	Name string
	// Brokers are the seed brokers, "host:port" (required).
	Brokers []string
	// Topic is the topic template (required); see Topic.
	Topic string
	// MaxRequestBytes is the record batch limit (default 1,000,012, at
	// most 1 GiB).
	MaxRequestBytes int
	// Oversize is the policy for an event whose record alone exceeds
	// MaxRequestBytes.
	Oversize sinks.Oversize
	// Canonical selects canonical instead of relaxed Extended JSON for
	// the value.
	Canonical bool
	// Timeout bounds one Send (default 10s).
	Timeout time.Duration

	// TLS enables TLS to the brokers, with the system's roots plus
	// TLSCAFile.
	TLS bool
	// TLSCAFile is a PEM file of extra CA certificates (optional).
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are a PEM client certificate and its key
	// (optional, together).
	TLSCertFile, TLSKeyFile string
	// TLSInsecureSkipVerify disables verification of the brokers'
	// certificates.
	TLSInsecureSkipVerify bool

	// SASLMechanism is "", SASLPlain, SASLScramSHA256 or SASLScramSHA512.
	SASLMechanism string
	// SASLUsername and SASLPassword are the SASL credentials (required
	// with a mechanism).
	SASLUsername, SASLPassword string

	// Dialer replaces the dialer (tests); nil: a net.Dialer.
	Dialer func(ctx context.Context, network, host string) (net.Conn, error)
}

// Kafka is a sinks.Sink that produces events to Kafka. It is safe for
// concurrent use by several workers.
type Kafka struct {
	name      string
	topic     *Topic
	maxBytes  int
	oversize  sinks.Oversize
	canonical bool
	timeout   time.Duration
	client    *kgo.Client
	log       *slog.Logger
	closed    atomic.Bool

	// limits holds each topic's record batch limit once looked up: the
	// smaller of maxBytes and the topic's max.message.bytes (int).
	limits sync.Map
}

var _ sinks.Sink = (*Kafka)(nil)

// errSendTimeout is the cause of a Send's own timeout.
var errSendTimeout = errors.New("send timeout")

// New returns a Kafka sink for cfg. It validates the configuration, reads
// the TLS files and creates the client; it does not connect (the client
// connects at the first Send). logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Kafka, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	errs := confcheck.New("kafka", cfg.Name)
	if len(cfg.Brokers) == 0 {
		errs.Addf("brokers is required")
	}
	for _, b := range cfg.Brokers {
		if msg := CheckBroker(b); msg != "" {
			errs.Addf("brokers: %s", msg)
		}
	}
	topic, err := CompileTopic(cfg.Topic)
	if err != nil {
		errs.Addf("topic: %v", err)
	}
	if cfg.MaxRequestBytes != 0 && (cfg.MaxRequestBytes < minRequestBytes || cfg.MaxRequestBytes > MaxRequestBytesLimit) {
		errs.Addf("max_request_bytes must be between %d and %d, got %d", minRequestBytes, MaxRequestBytesLimit, cfg.MaxRequestBytes)
	}
	if cfg.Timeout < 0 {
		errs.Addf("timeout must not be negative, got %s", cfg.Timeout)
	}
	tlsCfg, err := tlsConfig(cfg)
	if err != nil {
		errs.Add(err)
	}
	mech, err := saslMechanism(cfg)
	if err != nil {
		errs.Add(err)
	}
	if err := errs.Err(); err != nil {
		return nil, err
	}
	k := &Kafka{
		name: cfg.Name, topic: topic, maxBytes: cfg.MaxRequestBytes, oversize: cfg.Oversize,
		canonical: cfg.Canonical, timeout: cfg.Timeout, log: logger,
	}
	if k.maxBytes == 0 {
		k.maxBytes = DefaultMaxRequestBytes
	}
	if k.timeout == 0 {
		k.timeout = DefaultTimeout
	}
	clientID := "changegate"
	if cfg.Name != "" {
		clientID += "-" + cfg.Name
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(clientID),
		kgo.WithLogger(logAdapter{logger}),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytesFn(k.batchLimit),
		kgo.ProducerLinger(0),
		kgo.RecordRetries(RecordRetries),
		// A produce error waits for a metadata refresh before the
		// retry; franz-go's default minimum age of 5s would spend a
		// Send's timeout on two tries.
		kgo.MetadataMinAge(metadataMinAge),
		kgo.RecordDeliveryTimeout(k.timeout),
		kgo.ProduceRequestTimeout(k.timeout),
		kgo.AllowIdempotentProduceCancellation(),
	}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	if mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	if cfg.Dialer != nil {
		opts = append(opts, kgo.Dialer(cfg.Dialer))
	}
	if k.client, err = kgo.NewClient(opts...); err != nil {
		return nil, fmt.Errorf("%s: %w", errs.Prefix(), err)
	}
	return k, nil
}

// CheckBroker returns why b is not a "host:port" broker address, or "".
func CheckBroker(b string) string {
	host, port, err := net.SplitHostPort(b)
	if err != nil || host == "" || port == "" {
		return fmt.Sprintf("%q is not host:port", b)
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return fmt.Sprintf("%q: the port must be a number", b)
		}
	}
	return ""
}

// tlsConfig builds the TLS configuration of cfg, nil without TLS.
func tlsConfig(cfg Config) (*tls.Config, error) {
	if !cfg.TLS {
		if cfg.TLSCAFile != "" || cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" || cfg.TLSInsecureSkipVerify {
			return nil, errors.New("tls_ca_file, tls_cert_file, tls_key_file and tls_insecure_skip_verify need tls = true")
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.TLSInsecureSkipVerify} //nolint:gosec // an explicit option
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls_ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca_file: no PEM certificate found in %s", cfg.TLSCAFile)
		}
		c.RootCAs = pool
	}
	switch {
	case cfg.TLSCertFile != "" && cfg.TLSKeyFile != "":
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls_cert_file, tls_key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	case cfg.TLSCertFile != "" || cfg.TLSKeyFile != "":
		return nil, errors.New("tls_cert_file and tls_key_file go together")
	}
	return c, nil
}

// saslMechanism returns the SASL mechanism of cfg, nil without one.
func saslMechanism(cfg Config) (sasl.Mechanism, error) {
	if cfg.SASLMechanism == "" {
		if cfg.SASLUsername != "" || cfg.SASLPassword != "" {
			return nil, errors.New("sasl_username and sasl_password need sasl_mechanism")
		}
		return nil, nil
	}
	if cfg.SASLUsername == "" || cfg.SASLPassword == "" {
		return nil, fmt.Errorf("sasl_mechanism %s needs sasl_username and sasl_password", cfg.SASLMechanism)
	}
	switch cfg.SASLMechanism {
	case SASLPlain:
		return plain.Auth{User: cfg.SASLUsername, Pass: cfg.SASLPassword}.AsMechanism(), nil
	case SASLScramSHA256:
		return scram.Auth{User: cfg.SASLUsername, Pass: cfg.SASLPassword}.AsSha256Mechanism(), nil
	case SASLScramSHA512:
		return scram.Auth{User: cfg.SASLUsername, Pass: cfg.SASLPassword}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("sasl_mechanism %q is not one of %s, %s, %s", cfg.SASLMechanism, SASLPlain, SASLScramSHA256, SASLScramSHA512)
}

// Name returns the sink name.
func (k *Kafka) Name() string { return k.name }

// MaxBatch returns MaxRecords.
func (k *Kafka) MaxBatch() int { return MaxRecords }

// Close closes the client; records still buffered fail. No Send may follow
// Close.
func (k *Kafka) Close() error {
	if k.closed.CompareAndSwap(false, true) {
		k.client.Close()
	}
	return nil
}

// batchLimit is the client's record batch limit of topic (franz-go asks
// once per partition, when it first produces to it): the topic's limit when
// Send looked it up, else maxBytes.
func (k *Kafka) batchLimit(topic string) int32 {
	if v, ok := k.limits.Load(topic); ok {
		return int32(v.(int))
	}
	return int32(k.maxBytes)
}

// TopicLimit returns the record batch limit of topic: MaxRequestBytes, or
// the topic's max.message.bytes when that is lower. The topic's setting is
// asked for (DescribeConfigs) before the first record to the topic and
// remembered; when it cannot be read (no DESCRIBE_CONFIGS permission, say)
// MaxRequestBytes applies, and a failure other than authorization is
// asked again at the next Send.
func (k *Kafka) TopicLimit(ctx context.Context, topic string) int {
	if v, ok := k.limits.Load(topic); ok {
		return v.(int)
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	res.ConfigNames = []string{"max.message.bytes"}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, k.client)
	if err == nil && len(resp.Resources) == 1 {
		r := resp.Resources[0]
		err = kerr.ErrorForCode(r.ErrorCode)
		if err == nil {
			for _, c := range r.Configs {
				if c.Name != "max.message.bytes" || c.Value == nil {
					continue
				}
				n, perr := strconv.Atoi(*c.Value)
				if perr != nil || n <= 0 {
					break
				}
				limit := min(k.maxBytes, max(n, minRequestBytes))
				k.limits.Store(topic, limit)
				if limit < k.maxBytes {
					k.log.Info("topic limit below max_request_bytes", "topic", topic, "max_message_bytes", n, "max_request_bytes", k.maxBytes)
				}
				return limit
			}
		}
	}
	if errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
		k.log.Warn("cannot read the topic's max.message.bytes; max_request_bytes applies", "topic", topic, "err", err)
		k.limits.Store(topic, k.maxBytes)
	}
	return k.maxBytes
}

// Key returns the record key of e: its document key as canonical Extended
// JSON, nil for an event without one.
func Key(e *event.Event) []byte {
	if len(e.DocumentKey) == 0 {
		return nil
	}
	b, err := bson.MarshalExtJSON(e.DocumentKey, true, false)
	if err != nil {
		// Not valid BSON: the raw bytes still identify the document.
		return append([]byte(nil), e.DocumentKey...)
	}
	return b
}

// Record headers of the trace context (W3C Trace Context), with tracing on
// and trace_context = true.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// Headers returns the record headers of e; see the package documentation.
func Headers(e *event.Event) []kgo.RecordHeader {
	h := make([]kgo.RecordHeader, 0, 6)
	for _, m := range e.Metadata() {
		h = append(h, kgo.RecordHeader{Key: m.Name, Value: []byte(m.Value)})
		if m.Name == HeaderID && e.Source != "" {
			h = append(h, kgo.RecordHeader{Key: HeaderSource, Value: []byte(e.Source)})
		}
	}
	return h
}

// RecordSize is the size a record counts against MaxRequestBytes: its key,
// value and headers and an upper bound of the batch and record overhead.
func RecordSize(key, value []byte, headers []kgo.RecordHeader) int {
	n := batchOverhead + recordOverhead + len(key) + len(value)
	for _, h := range headers {
		n += headerOverhead + len(h.Key) + len(h.Value)
	}
	return n
}

// Send produces batch and waits for every record's outcome; see the
// package documentation. When ctx ends, Send returns ctx's error, wrapped.
func (k *Kafka) Send(ctx context.Context, batch []*event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	prefix := "kafka " + k.name
	if k.closed.Load() {
		return sinks.Retryable("closed", 0, fmt.Errorf("%s: send after close", prefix))
	}
	sctx, cancel := context.WithTimeoutCause(ctx, k.timeout, errSendTimeout)
	defer cancel()
	failed := map[int]error{}
	limits := map[string]int{} // each topic's limit, asked once per Send
	records := make([]*kgo.Record, 0, len(batch))
	idx := make([]int, 0, len(batch))
	stripped := make([]bool, len(batch))
	// built is what this Send makes for the call: the produce requests the
	// client encodes from the records (RecordSize each, an upper bound) and
	// the stripped payloads, charged to the byte budget while the records
	// are produced.
	built := 0
	for i, e := range batch {
		topic := k.topic.Execute(e)
		if msg := CheckTopicName(topic); msg != "" {
			failed[i] = sinks.Permanent("invalid_topic", fmt.Errorf("%s: event %s: %s", prefix, e.ID, msg))
			continue
		}
		env, err := e.Envelope(k.canonical)
		if err != nil {
			failed[i] = sinks.Permanent("encode", fmt.Errorf("%s: %w", prefix, err))
			continue
		}
		key, headers := Key(e), Headers(e)
		if tp, ts := tracing.Entry(ctx, i); tp != "" {
			headers = append(headers, kgo.RecordHeader{Key: HeaderTraceparent, Value: []byte(tp)})
			if ts != "" {
				headers = append(headers, kgo.RecordHeader{Key: HeaderTracestate, Value: []byte(ts)})
			}
		}
		limit, ok := limits[topic]
		if !ok {
			limit = k.TopicLimit(sctx, topic)
			limits[topic] = limit
		}
		p, err := k.oversize.Fit(e, k.canonical, env, limit, func(b []byte) int {
			return RecordSize(key, b, headers)
		}, prefix, "record")
		if err != nil {
			failed[i] = err
			continue
		}
		stripped[i] = p.Stripped
		built += p.Size + p.Built()
		records = append(records, &kgo.Record{Topic: topic, Key: key, Value: p.Body, Headers: headers})
		idx = append(idx, i)
	}

	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", prefix, ctx.Err())
	}
	if len(records) > 0 {
		// ProduceSync returns once every record's promise has run: the
		// client holds none of them any more.
		release := sinks.Hold(ctx, int64(built))
		results := k.client.ProduceSync(sctx, records...)
		release()
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", prefix, ctx.Err())
		}
		// ProduceSync returns the results in the order the records
		// finished, not the order given: find each record's event.
		pos := make(map[*kgo.Record]int, len(records))
		for j, r := range records {
			pos[r] = idx[j]
		}
		for _, r := range results {
			i, ok := pos[r.Record]
			if !ok {
				return sinks.Retryable("missing_result", 0, fmt.Errorf("%s: the client returned a result for a record it was not given", prefix))
			}
			delete(pos, r.Record)
			if r.Err != nil {
				failed[i] = Classify(prefix, batch[i].ID, r.Err)
			}
		}
		for _, i := range pos {
			failed[i] = sinks.Retryable("missing_result", 0, fmt.Errorf("%s: event %s: the client returned no result for the record", prefix, batch[i].ID))
		}
	}
	err := result(failed, len(batch))
	k.oversize.Delivered(stripped, err)
	return err
}

// result is Send's result for failed of n events: nil, one *sinks.Error
// when every event failed with the same decision and reason, or a
// *sinks.BatchError.
func result(failed map[int]error, n int) error {
	if len(failed) == 0 {
		return nil
	}
	if len(failed) == n {
		var first *sinks.Error
		same := true
		for _, err := range failed {
			var de *sinks.Error
			if !errors.As(err, &de) {
				same = false
				break
			}
			if first == nil {
				first = de
			} else if de.Permanent != first.Permanent || de.Reason != first.Reason {
				same = false
				break
			}
		}
		if same && first != nil {
			return first
		}
	}
	return &sinks.BatchError{Failed: failed}
}

// permanentCodes are the broker errors that refuse the record itself:
// sending it again cannot succeed.
var permanentCodes = map[int16]bool{
	kerr.InvalidRecord.Code:               true,
	kerr.CorruptMessage.Code:              true,
	kerr.InvalidTimestamp.Code:            true,
	kerr.InvalidTopicException.Code:       true,
	kerr.PolicyViolation.Code:             true,
	kerr.UnsupportedForMessageFormat.Code: true,
	kerr.TopicAuthorizationFailed.Code:    true,
	kerr.ClusterAuthorizationFailed.Code:  true,
}

// Classify turns the error of one produced record into a retry decision;
// see the package documentation.
func Classify(prefix, eventID string, err error) *sinks.Error {
	werr := fmt.Errorf("%s: event %s: %w", prefix, eventID, err)
	var ke *kerr.Error
	switch {
	case errors.As(err, &ke):
		reason := strings.ToLower(ke.Message)
		de := sinks.Retryable(reason, 0, werr)
		de.Permanent = permanentCodes[ke.Code]
		de.Code = ke.Message // the broker's error name, as Kafka documents it
		return de
	case errors.Is(err, errSendTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, kgo.ErrRecordTimeout):
		return sinks.Retryable("timeout", 0, werr)
	case errors.Is(err, kgo.ErrRecordRetries):
		return sinks.Retryable("retries", 0, werr)
	case errors.Is(err, kgo.ErrClientClosed):
		return sinks.Retryable("closed", 0, werr)
	default:
		var ne net.Error
		var oe *net.OpError
		if errors.As(err, &ne) || errors.As(err, &oe) || errors.Is(err, os.ErrDeadlineExceeded) {
			return sinks.Retryable("transport", 0, werr)
		}
		return sinks.Retryable("error", 0, werr)
	}
}

// logAdapter is franz-go's logger on slog; the client logs at warn and
// above.
type logAdapter struct{ l *slog.Logger }

func (a logAdapter) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (a logAdapter) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		lv = slog.LevelError
	case kgo.LogLevelWarn:
		lv = slog.LevelWarn
	case kgo.LogLevelInfo:
		lv = slog.LevelInfo
	}
	a.l.Log(context.Background(), lv, "kafka client: "+msg, keyvals...)
}
