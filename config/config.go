// Package config loads and validates changegate's TOML configuration.
//
// [Load] and [Parse] decode a file strictly: unknown keys, values of the
// wrong type, missing required keys, invalid enum values, duplicate names,
// references to unknown sources or sinks, invalid durations, filters and
// pipelines are all reported together, each as an [*Error] naming the key
// path and the file:line it comes from, joined with [errors.Join].
//
// String values may reference environment variables as ${VAR} (an error when
// VAR is unset) or ${VAR:-default} (default when VAR is unset or empty);
// "$${" stands for a literal "${". Secret-capable values (see [Secret]) may
// also be written "file:/path" to read the secret from a file; a relative
// path is resolved against the configuration file's directory.
//
// The returned [Config] is immutable by convention: every default is filled
// in, durations are [time.Duration] values and secrets are [Secret] values
// that never print.
package config

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Config is a validated changegate configuration with every default filled in.
type Config struct {
	// File is the file name the configuration was parsed from, as given to
	// Load or Parse.
	File string
	// MaxInFlightBytes is the top-level max_in_flight_bytes: the byte budget
	// of everything the process holds of events, shared by every source
	// and sink (at least MinMaxInFlightBytes); 0 when not set, for the
	// default sized from the container's memory limit (package memory).
	MaxInFlightBytes int64
	// MaxInFlightBytesLine is the line of max_in_flight_bytes (0: not set).
	MaxInFlightBytesLine int
	// Mongo is the [mongo] table: the cluster to watch and where state lives.
	Mongo Mongo
	// Server is the [server] table: the admin/metrics HTTP listener and
	// shutdown behaviour.
	Server Server
	// Cluster is the [cluster] table: leases shared by several replicas.
	Cluster Cluster
	// DeliveryLog is the [delivery_log] table: per-attempt records.
	DeliveryLog DeliveryLog
	// Sources are the [[sources]] entries in file order; names are unique.
	Sources []Source
	// Sinks are the [[sinks]] entries in file order; names are unique.
	Sinks []Sink
	// Rules are the [[rules]] entries in file order; names are unique and
	// every referenced source and sink exists.
	Rules []Rule
	// Subscriptions is the [subscriptions] table: what the subscriptions
	// API may do.
	Subscriptions Subscriptions
}

// CheckContainerLimit reports a max_in_flight_bytes above the container's
// memory limit (limit bytes; 0: no limit), as an [*Error] with its
// file:line; nil when it fits or is not set.
func (c *Config) CheckContainerLimit(limit int64) error {
	if c.MaxInFlightBytes == 0 || limit <= 0 || c.MaxInFlightBytes <= limit {
		return nil
	}
	return &Error{Key: "max_in_flight_bytes", File: c.File, Line: c.MaxInFlightBytesLine,
		Msg: fmt.Sprintf("must not exceed the container's memory limit (%d bytes), got %d", limit, c.MaxInFlightBytes)}
}

// Source returns the source named name, or nil.
func (c *Config) Source(name string) *Source {
	for i := range c.Sources {
		if c.Sources[i].Name == name {
			return &c.Sources[i]
		}
	}
	return nil
}

// Sink returns the sink named name, or nil.
func (c *Config) Sink(name string) *Sink {
	for i := range c.Sinks {
		if c.Sinks[i].Name == name {
			return &c.Sinks[i]
		}
	}
	return nil
}

// Mongo is the [mongo] table.
type Mongo struct {
	// URI is the MongoDB connection string (required, secret-capable).
	URI Secret
	// StateDatabase holds the checkpoint and dead-letter collections
	// (default "changegate").
	StateDatabase string
	// CheckpointCollection is the collection of persisted resume tokens
	// (default "checkpoints").
	CheckpointCollection string
	// DeadLetterCollection is the collection of dead letters (default
	// "deadletters").
	DeadLetterCollection string
}

// Server is the [server] table.
type Server struct {
	// Listen is the address of the admin/metrics HTTP server (default
	// ":9464"). Empty means the server is disabled.
	Listen string
	// ShutdownGrace is how long in-flight deliveries may drain after
	// SIGINT/SIGTERM before they are abandoned (default 30s).
	ShutdownGrace time.Duration
	// ReadyMaxLag is how long a source's checkpoint may stand still while
	// events are in flight, or a sink may go without a delivery while it
	// fails, before /readyz reports it (default 30s, >= 1s).
	ReadyMaxLag time.Duration
	// AdminToken is the bearer token required by mutating admin API calls
	// and, unless PublicRead, by reads of data (status details, dead
	// letters) (optional, secret-capable). Empty disables those calls.
	AdminToken Secret
	// PublicRead serves /api/v1/status, the details of /readyz and the dead
	// letters without a token (default false). /healthz, /readyz (its
	// verdict) and /metrics never need one.
	PublicRead bool
	// AllowedHosts are the host names (lower case, without port) the admin
	// server answers to in the Host header; requests addressed to any other
	// name are refused, which defeats DNS rebinding. IP literals are always
	// accepted (a rebinding page sends its own name). Nil means the
	// default: localhost (and *.localhost), the host of Listen and the
	// machine's host name; "*" accepts any name.
	AllowedHosts []string
	// Console serves the web console (GET / and /ui/...) on the admin
	// listener (default true).
	Console bool
	// ConsoleAuth says who may read the console's pages: ConsoleAuthNone
	// (anyone who can reach the listener, as PublicRead is for the API) or
	// ConsoleAuthToken (the admin token, which the page's script sends as
	// a bearer token). Unset, it follows the API's read policy: "none"
	// with PublicRead, "token" otherwise (see ConsoleReadAuth); with
	// "token" and no AdminToken the pages show no data at all, as the API
	// refuses reads then. Actions always need the admin token.
	ConsoleAuth string
	// Tokens are the [[server.tokens]] entries: bearer tokens scoped to
	// the subscriptions whose names start with their prefix; nil when
	// none.
	Tokens []Token
}

// ConsoleReadAuth returns s.ConsoleAuth, or when it is empty (a Server not
// decoded from a file) the value it defaults to: ConsoleAuthNone with
// PublicRead, else ConsoleAuthToken. The console reads data for a request
// only as the API would, unless console_auth = "none" says otherwise.
func (s Server) ConsoleReadAuth() string {
	switch {
	case s.ConsoleAuth != "":
		return s.ConsoleAuth
	case s.PublicRead:
		return ConsoleAuthNone
	}
	return ConsoleAuthToken
}

// Values of [Server.ConsoleAuth].
const (
	ConsoleAuthNone  = "none"
	ConsoleAuthToken = "token"
)

// Full-document modes of [Source.FullDocument], as the MongoDB driver spells them.
const (
	FullDocumentDefault       = "default"
	FullDocumentUpdateLookup  = "updateLookup"
	FullDocumentWhenAvailable = "whenAvailable"
	FullDocumentRequired      = "required"
)

// Pre-image modes of [Source.FullDocumentBeforeChange]. "off" means the
// option is not sent.
const (
	FullDocumentBeforeChangeOff           = "off"
	FullDocumentBeforeChangeWhenAvailable = "whenAvailable"
	FullDocumentBeforeChangeRequired      = "required"
)

// OnHistoryLost says what a source does when its resume token has fallen off
// the oplog (MongoDB error 286, ChangeStreamHistoryLost).
type OnHistoryLost string

const (
	// HistoryLostFail makes the process exit non-zero with an explanation.
	HistoryLostFail OnHistoryLost = "fail"
	// HistoryLostResumeFromNow restarts the stream from the current time
	// and records the gap in the dead-letter collection.
	HistoryLostResumeFromNow OnHistoryLost = "resume_from_now"
)

// Large change event modes of [Source.SplitLargeEvents].
const (
	// SplitLargeEventsAuto appends $changeStreamSplitLargeEvent to the
	// change stream pipeline when the server supports it (MongoDB 7.0+ and
	// 6.0.9+) and reassembles the fragments into one event.
	SplitLargeEventsAuto = "auto"
	// SplitLargeEventsOff never adds the stage.
	SplitLargeEventsOff = "off"
)

// Reactions to a change event MongoDB cannot return (BSONObjectTooLarge,
// 10334), of [Source.OnOversizeEvent].
const (
	// OversizeEventFail stops the source with an error naming the change.
	OversizeEventFail = "fail"
	// OversizeEventSkip records a gap dead letter and resumes after it.
	OversizeEventSkip = "skip"
)

// Reactions of [Sink.Oversize] to an event over the sink's payload limit.
const (
	// OversizeDeadLetter dead-letters the event (reason "oversize").
	OversizeDeadLetter = "deadletter"
	// OversizeStrip sends the envelope without fullDocument and
	// fullDocumentBeforeChange, marked "truncated": true, and if need be
	// with updateDescription truncated too (sinks.Oversize.Fit).
	OversizeStrip = "strip"
)

// Values of [Sink.Transactions].
const (
	// TransactionsNone delivers the events of a transaction as single
	// events (the default).
	TransactionsNone = "none"
	// TransactionsGroup delivers every event of one transaction routed to
	// the sink together: one request for webhook and Lambda, consecutive
	// entries or records for the other types.
	TransactionsGroup = "group"
)

// splitLargeEventStage is the name of MongoDB's split stage.
const splitLargeEventStage = "$changeStreamSplitLargeEvent"

// Source is one [[sources]] entry: one change stream.
type Source struct {
	// Name identifies the source in rules, checkpoints, event ids, logs and
	// metrics; unique, matching [A-Za-z0-9_.-]+.
	Name string
	// Database is the watched database; empty watches the whole cluster.
	Database string
	// Collection is the watched collection; empty watches the whole
	// database (or cluster). Non-empty only when Database is.
	Collection string
	// FullDocument is one of the FullDocument* constants (default "default").
	FullDocument string
	// FullDocumentBeforeChange is one of the FullDocumentBeforeChange*
	// constants (default "off").
	FullDocumentBeforeChange string
	// Pipeline holds extra aggregation stages appended to the change stream
	// pipeline, in order; nil when none. Assignable to mongo.Pipeline.
	Pipeline []bson.D
	// StartAt is where the stream begins on its very first start (no
	// checkpoint); the zero time means "now".
	StartAt time.Time
	// OnHistoryLost is the reaction to lost history (default fail).
	OnHistoryLost OnHistoryLost
	// SplitLargeEvents is SplitLargeEventsAuto (default) or
	// SplitLargeEventsOff.
	SplitLargeEvents string
	// OnOversizeEvent is OversizeEventFail (default) or OversizeEventSkip:
	// the reaction to a change event over 16 MB the server cannot split.
	OnOversizeEvent string
	// BatchSize is the change stream cursor batch size; 0 leaves it to the
	// server.
	BatchSize int32
	// MaxAwait is the getMore maxAwaitTimeMS (default 1s); 0 leaves it to
	// the server.
	MaxAwait time.Duration
	// MaxInFlightEvents caps the events read but not yet acknowledged; when
	// reached the source stops reading (default 10000, always > 0).
	MaxInFlightEvents int
	// CheckpointInterval is the most often a checkpoint is persisted
	// (default 1s, always > 0).
	CheckpointInterval time.Duration
	// Partitions splits the source into this many units, each its own
	// change stream over a hash of documentKey, checkpoint and lease
	// (default 1, at most 256).
	Partitions int
	// Snapshot is SnapshotNever (default) or SnapshotInitial: on a first
	// start (no checkpoint) deliver every existing document as a
	// "snapshot" event before the change stream.
	Snapshot string
}

// Snapshot modes of [Source.Snapshot].
const (
	SnapshotNever   = "never"
	SnapshotInitial = "initial"
)

// Level says what the source watches: "collection", "database" or "cluster".
func (s *Source) Level() string {
	switch {
	case s.Collection != "":
		return "collection"
	case s.Database != "":
		return "database"
	default:
		return "cluster"
	}
}

// Sink types.
const (
	// SinkWebhook posts events to an HTTP endpoint; see [WebhookSink].
	SinkWebhook = "webhook"
	// SinkEventBridge puts events on an Amazon EventBridge bus; see
	// [EventBridgeSink].
	SinkEventBridge = "eventbridge"
	// SinkSQS sends events to an Amazon SQS queue; see [SQSSink].
	SinkSQS = "sqs"
	// SinkLambda invokes an AWS Lambda function; see [LambdaSink].
	SinkLambda = "lambda"
)

// Ordering is a sink's delivery ordering guarantee.
type Ordering string

const (
	// OrderingKey delivers events of one documentKey in change-stream
	// order; different documents proceed in parallel.
	OrderingKey Ordering = "key"
	// OrderingNone delivers events in any order.
	OrderingNone Ordering = "none"
	// OrderingStrict delivers one batch at a time, in change-stream order.
	OrderingStrict Ordering = "strict"
)

// JSONFormat is the Extended JSON flavour of the envelope.
type JSONFormat string

const (
	// JSONRelaxed is relaxed Extended JSON (the default).
	JSONRelaxed JSONFormat = "relaxed"
	// JSONCanonical is canonical Extended JSON.
	JSONCanonical JSONFormat = "canonical"
)

// Sink is one [[sinks]] entry. The options common to every type are fields
// of Sink; the options of its type are in the pointer field for that type,
// which is non-nil exactly when Type names it (other type fields are nil).
type Sink struct {
	// Name identifies the sink in rules, dead letters, logs and metrics;
	// unique, matching [A-Za-z0-9_.-]+.
	Name string
	// Type is the sink type, e.g. SinkWebhook.
	Type string
	// MaxInFlight is a fixed number of concurrent deliveries (max_in_flight
	// = N, >= 1), or 0 for "auto" (the default): an adaptive limit within
	// MaxInFlightMin..MaxInFlightMax, also bounded by the sources'
	// max_in_flight_events.
	MaxInFlight int
	// MaxInFlightMin and MaxInFlightMax bound the adaptive limit (default
	// 1 and 0; Min <= Max when Max is set); both 0 when MaxInFlight is
	// fixed. MaxInFlightMax 0 (max_in_flight_max not set) leaves the
	// ceiling to the sources' max_in_flight_events and the open-file
	// limit (app.adaptiveCeiling).
	MaxInFlightMin, MaxInFlightMax int
	// RateLimit caps requests per second (rate_limit, e.g. "500/s"); 0
	// means none.
	RateLimit float64
	// RateLimitBurst is the token bucket size (rate_limit_burst; default
	// one second's worth, at least 1); 0 when RateLimit is 0.
	RateLimitBurst int
	// CircuitMaxCooldown (circuit_max_cooldown, 1s..1h, default 10s) caps
	// how long an open circuit waits before its next probe: a receiver
	// that recovered is seen within it.
	CircuitMaxCooldown time.Duration
	// Ordering is the ordering guarantee (default OrderingKey).
	Ordering Ordering
	// BatchSize is the maximum number of events per request (default 1;
	// between 1 and the type's maximum).
	BatchSize int
	// BatchWait is how long to wait to fill a batch before sending a
	// partial one (default 0: send what is there).
	BatchWait time.Duration
	// JSON is the Extended JSON flavour of the envelope (default relaxed).
	JSON JSONFormat
	// ParkAfter isolates a failing sink: once it has failed to deliver for
	// this long, its backlog is parked in MongoDB and re-driven in order when
	// it recovers (default 30s; 0 disables parking).
	ParkAfter time.Duration
	// Retry is the retry policy, defaults filled in.
	Retry Retry
	// TraceContext puts the trace context (W3C traceparent, X-Ray trace
	// header) in the sink's requests and messages when tracing is on
	// (trace_context, default true).
	TraceContext bool
	// Oversize is what happens to an event whose payload alone exceeds the
	// sink's limit (max_request_bytes of every sink type):
	// OversizeDeadLetter (default) or OversizeStrip.
	Oversize string
	// Transactions is TransactionsNone (default) or TransactionsGroup:
	// the events of one multi-document transaction go out together, and
	// no later change of their documents before them.
	Transactions string
	// Shape is the payload shaping of the sink (fields, redact,
	// envelope, ...); see Shape.
	Shape Shape

	// Webhook holds the options of a webhook sink; nil for other types.
	Webhook *WebhookSink
	// EventBridge holds the options of an eventbridge sink; nil for other
	// types.
	EventBridge *EventBridgeSink
	// SQS holds the options of an sqs sink; nil for other types.
	SQS *SQSSink
	// Lambda holds the options of a lambda sink; nil for other types.
	Lambda *LambdaSink

	// Kinesis holds the options of a kinesis sink; nil for other types.
	Kinesis *KinesisSink
	// SNS holds the options of an sns sink; nil for other types.
	SNS *SNSSink
	// Kafka holds the options of a kafka sink; nil for other types.
	Kafka *KafkaSink

	// Held keeps the sink from receiving anything: what is routed to it is
	// parked until a configuration without Held releases it. Never read
	// from a file: subscription.Merge sets it for a paused subscription.
	Held bool
}

// Retry is a sink's retry policy: exponential backoff with jitter.
type Retry struct {
	// MaxAttempts is the total number of attempts including the first
	// (default 8, >= 1).
	MaxAttempts int
	// InitialInterval is the delay before the first retry (default 500ms).
	InitialInterval time.Duration
	// MaxInterval caps the delay between attempts (default 1m,
	// >= InitialInterval).
	MaxInterval time.Duration
	// MaxElapsed caps the time from the first attempt after which no retry
	// is started (default 15m; 0 means no limit besides MaxAttempts).
	MaxElapsed time.Duration
	// Multiplier is the backoff growth factor (default 2, >= 1).
	Multiplier float64
	// Jitter is the relative randomisation of each delay, in [0, 1]
	// (default 0.2).
	Jitter float64
}

// WebhookSink holds the options of a webhook sink.
type WebhookSink struct {
	// URL is the http or https endpoint events are POSTed to.
	URL string
	// Secrets are the Standard Webhooks signing secrets ("whsec_" + base64,
	// or raw); each request carries one signature per secret, which allows
	// rotation. Empty: requests are not signed. Filled from either "secret"
	// or "secrets".
	Secrets []Secret
	// Headers are extra request headers in file order; values are
	// secret-capable.
	Headers []Header
	// BearerToken, when set, is sent as "Authorization: Bearer <token>".
	BearerToken Secret
	// BasicAuth, when non-nil, is sent as HTTP basic authentication.
	// Exclusive with BearerToken.
	BasicAuth *BasicAuth
	// MaxRequestBytes caps the body of one request (default 1 MiB, at most
	// 1 GiB): a batch larger than that is sent as several requests; an
	// event whose envelope alone is larger follows Sink.Oversize.
	MaxRequestBytes int
	// Timeout bounds one request, including reading the response (default
	// 10s, > 0).
	Timeout time.Duration
	// AllowPrivateNetworks permits targets resolving to loopback, private,
	// link-local or metadata addresses (default false: refused at dial time).
	AllowPrivateNetworks bool
	// TLSCAFile is a PEM file of extra CA certificates trusted besides the
	// system pool (absolute path; empty: none).
	TLSCAFile string
	// TLSInsecureSkipVerify disables server certificate verification.
	TLSInsecureSkipVerify bool
	// Auth is "" or WebhookAuthSigV4: every request is then signed with
	// AWS Signature Version 4 (after the Standard Webhooks headers), with
	// the AWS sinks' credential chain.
	Auth string
	// AWSService is the SigV4 signing name (default "lambda", for function
	// URLs; "execute-api" for API Gateway); set only with Auth.
	AWSService string
	// Region is the SigV4 signing region: region, or the one in a function
	// URL's or execute-api host; set only with Auth.
	Region string
	// RoleARN is a role to assume with STS for signing (empty: none).
	RoleARN string
}

// WebhookAuthSigV4 is the webhook auth value that signs requests with AWS
// Signature Version 4.
const WebhookAuthSigV4 = "aws_sigv4"

// LambdaSink holds the options of a lambda sink. AWS.MaxRequestBytes is
// the payload limit of one invocation (default and maximum: the Invoke
// limit of the invocation type).
type LambdaSink struct {
	AWS
	// Function is the function's name, name:qualifier, full or partial
	// ARN, as Lambda's Invoke accepts it.
	Function string
	// Qualifier is a version or alias (optional).
	Qualifier string
	// InvocationType is LambdaInvocationEvent (default) or
	// LambdaInvocationRequestResponse.
	InvocationType string
	// ClientContext is a JSON object passed (base64-encoded) to synchronous
	// invocations (optional).
	ClientContext string
}

// Lambda invocation types of [LambdaSink.InvocationType].
const (
	LambdaInvocationEvent           = "Event"
	LambdaInvocationRequestResponse = "RequestResponse"
)

// AWS holds the options shared by the AWS sinks. Credentials come from the
// SDK's default chain (environment, shared profile, web identity, ECS/EC2
// roles); RoleARN is assumed on top of them.
type AWS struct {
	// Region is the AWS region (empty: AWS_REGION or the shared profile's).
	Region string
	// Endpoint overrides the service endpoint, e.g. LocalStack's (empty:
	// the region's endpoint).
	Endpoint string
	// RoleARN is a role to assume with STS (empty: none).
	RoleARN string
	// MaxRequestBytes caps the size of one batch request.
	MaxRequestBytes int
	// Timeout bounds one delivery request (default 10s).
	Timeout time.Duration
}

// EventBridgeSink holds the options of an eventbridge sink.
type EventBridgeSink struct {
	AWS
	// EventBus is the event bus name or ARN.
	EventBus string
	// Source is the entries' Source template (default
	// "changegate.{source}"); placeholders {db} {coll} {operationType}
	// {source}.
	Source string
	// DetailType is the entries' DetailType template (default
	// "{db}.{coll}.{operationType}").
	DetailType string
	// Resources are ARNs attached to every entry (optional).
	Resources []string
}

// SQSSink holds the options of an sqs sink. Exactly one of QueueURL and
// QueueName is set.
type SQSSink struct {
	AWS
	// QueueURL is the queue URL.
	QueueURL string
	// QueueName is the queue name, resolved with GetQueueUrl at first use.
	QueueName string
	// MessageGroupID is the dotted path of the event field whose value is
	// the FIFO MessageGroupId (empty: namespace and document key). Only for
	// FIFO queues.
	MessageGroupID string
}

// FIFO reports whether the queue is a FIFO queue (its name ends in ".fifo").
func (s *SQSSink) FIFO() bool {
	return strings.HasSuffix(s.QueueURL, ".fifo") || strings.HasSuffix(s.QueueName, ".fifo")
}

// Header is one extra HTTP request header of a webhook sink.
type Header struct {
	// Name is the canonical header name.
	Name string
	// Value is the header value (secret-capable).
	Value Secret
}

// BasicAuth is HTTP basic authentication.
type BasicAuth struct {
	// Username is the user name.
	Username string
	// Password is the password (secret-capable).
	Password Secret
}

// Operation types a rule may select in [Rule.Operations].
var operationTypes = []string{"insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate", "snapshot"}

// Rule is one [[rules]] entry: which events of a source go to which sinks.
type Rule struct {
	// Name identifies the rule in envelopes, logs and metrics; unique,
	// matching [A-Za-z0-9_.-]+.
	Name string
	// Source is the name of an existing source.
	Source string
	// Operations are the operation types the rule matches (insert, update,
	// replace, delete, drop, rename, dropDatabase, invalidate); nil matches
	// every operation.
	Operations []string
	// Namespaces restrict a database or cluster source to some namespaces;
	// nil matches every namespace.
	Namespaces []Namespace
	// Filter is a MongoDB query over the change event, keys in file order;
	// nil when absent. It has been validated with query.Compile.
	Filter bson.D
	// Sinks are the names of existing sinks the matching events go to;
	// non-empty, without duplicates.
	Sinks []string
	// Shape is the payload shaping of the events this rule routes
	// (fields, redact, envelope, ...); see Shape.
	Shape Shape
}

// Namespace is a rule namespace pattern, "db.coll" or "db.*".
type Namespace struct {
	// Database is the database name.
	Database string
	// Collection is the collection name; empty for "db.*", which matches
	// every collection of Database and database-level events.
	Collection string
}

// String returns the pattern as written ("db.coll" or "db.*").
func (n Namespace) String() string {
	if n.Collection == "" {
		return n.Database + ".*"
	}
	return n.Database + "." + n.Collection
}

// Match reports whether an event's namespace matches the pattern. coll is
// empty for database-level events such as dropDatabase.
func (n Namespace) Match(db, coll string) bool {
	if db != n.Database {
		return false
	}
	return n.Collection == "" || n.Collection == coll
}

// Secret is a string that must not be printed or logged: a password, token,
// signing secret or a connection string with credentials. It formats as
// "[redacted]" (or "" when empty) with fmt, encoding.TextMarshaler (JSON,
// TOML) and log/slog; use [Secret.Value] to get the real value.
type Secret string

const redacted = "[redacted]"

// Value returns the secret itself.
func (s Secret) Value() string { return string(s) }

// String implements fmt.Stringer without revealing the secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer (%#v) without revealing the secret.
func (s Secret) GoString() string { return `"` + s.String() + `"` }

// Format implements fmt.Formatter so that no verb (%x, %q, %v, %#v, ...)
// reveals the secret.
func (s Secret) Format(f fmt.State, verb rune) {
	switch verb {
	case 'q':
		_, _ = f.Write([]byte(`"` + s.String() + `"`))
	case 'v':
		if f.Flag('#') {
			_, _ = f.Write([]byte(s.GoString()))
			return
		}
		_, _ = f.Write([]byte(s.String()))
	default:
		_, _ = f.Write([]byte(s.String()))
	}
}

// MarshalText implements encoding.TextMarshaler without revealing the secret.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// LogValue implements slog.LogValuer without revealing the secret.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Load reads and parses the configuration file at path, expanding ${VAR}
// references from the process environment. See [Parse].
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, os.LookupEnv)
}

// Parse decodes and validates a configuration. filename is used in error
// messages exactly as given and to resolve relative file: secret paths and
// tls_ca_file; lookupEnv resolves ${VAR} references (nil: no variable is
// set). The error, if any, joins one [*Error] per problem found, sorted by
// line.
func Parse(filename string, data []byte, lookupEnv func(string) (string, bool)) (*Config, error) {
	if lookupEnv == nil {
		lookupEnv = func(string) (string, bool) { return "", false }
	}
	d := &decoder{file: filename, lookupEnv: lookupEnv, sinkTypes: builtinSinkTypes()}
	// Editors on some systems save a UTF-8 byte order mark; TOML has no use
	// for it (line numbers are unaffected).
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	return d.parse(data)
}
