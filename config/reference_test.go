package config

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The configuration reference, docs/configuration.md, is generated from
// Describe (the keys the decoder itself asks for, with their types,
// defaults and ranges) and the descriptions below. Regenerate it with
//
//	go generate ./config
//
// (which runs this test with -update). The tests fail, naming the key and
// the file to fix, when a key the decoder accepts has no description here,
// is missing from config.example.toml, or when the committed reference is
// stale.

var update = flag.Bool("update", false, "rewrite docs/configuration.md from config.Describe")

const (
	referenceFile = "../docs/configuration.md"
	exampleFile   = "../config.example.toml"
)

// keyDoc documents one key path. Default, Type and Range override what
// Describe reports, for the few keys whose default the decoder computes by
// hand (a template, $HOSTNAME, lease_ttl / 3) or whose value it reads by
// hand ("auto" or a number).
type keyDoc struct {
	Doc      string
	Default  string
	Type     string
	Range    string
	Required bool
}

// keyDocs describes every key Describe returns, by path. A key added to the
// decoder fails TestConfigurationReference until it is described here.
var keyDocs = map[string]keyDoc{
	"max_in_flight_bytes":         {Default: "25% of the container's memory limit, else 268435456 (256 MiB)", Doc: "Top level, before the first table. The byte budget of everything the process holds of events (raw changes, shaped views, encodings, request bodies, entries read by re-drives and replays), shared by every source and sink; sources stop reading while it is spent, and one change larger than it goes alone. `changegate check` prints the budget in force and where it comes from. Without `GOMEMLIMIT` in the environment, the Go memory limit is set to 90% of the container's limit."},
	"mongo":                       {Doc: "The MongoDB deployment to watch (a replica set or sharded cluster, 5.0+) and where changegate keeps its own state."},
	"mongo.uri":                   {Doc: "Connection string (`mongodb://` or `mongodb+srv://`). Change streams need a replica set or a sharded cluster."},
	"mongo.state_database":        {Doc: "Database holding checkpoints, dead letters, parked events and leases. Whole-cluster sources leave it out (stream, snapshot, backfills); a database-level source of it is refused."},
	"mongo.checkpoint_collection": {Doc: "Collection of persisted resume tokens, one document per unit of work."},
	"mongo.deadletter_collection": {Doc: "Collection of dead letters (inspect and replay them with `changegate deadletters`); must differ from `checkpoint_collection`."},

	"server":                {Doc: "The admin HTTP server: `/metrics`, `/healthz`, `/readyz`, `/api/v1/...` and the web console (see [operations](operations.md))."},
	"server.listen":         {Doc: "Listen address, `host:port` or `:port`; `\"\"` disables the server.", Default: `":9464"`},
	"server.shutdown_grace": {Doc: "On SIGINT/SIGTERM, how long deliveries in flight may finish before they are abandoned (and re-delivered after the restart)."},
	"server.ready_max_lag":  {Doc: "`/readyz` reports a source whose checkpoint has not advanced for this long while events are in flight, and a failing sink that has not delivered for this long."},
	"server.admin_token":    {Doc: "Bearer token required by mutating admin API calls (replay, purge, reload, backfill) and, unless `public_read`, by reads of data. At least 16 characters; without one those calls are disabled."},
	"server.public_read":    {Doc: "Serve `/api/v1/status`, the dead letters and the details of `/readyz` without a token. `/healthz`, `/readyz` (its verdict) and `/metrics` are always open."},
	"server.allowed_hosts":  {Doc: "Host names (without port) the admin server answers to; others get 421 (defeats DNS rebinding). IP literals, `localhost` and `*.localhost` are always accepted; `\"*\"` accepts any.", Default: "the host of `listen` and the machine's host name"},
	"server.console":        {Doc: "Serve the web console at `GET /` (and `/ui/...`)."},
	"server.console_auth":   {Doc: "Who may read the console's pages: `\"none\"` (anyone who reaches the listener) or `\"token\"` (the admin token; set explicitly it needs `admin_token`, derived without one the pages show no data, as the API refuses reads). Unset, it follows the API's read policy. Its actions always need the admin token.", Default: "`\"none\"` with `public_read = true`, else `\"token\"`"},

	"server.tokens":          {Doc: "Bearer tokens scoped to a subscription name prefix, for the teams that manage their own subscriptions (see `[subscriptions]`). The admin token may do everything; a scoped token manages only the subscriptions whose names start with its `prefix` and reads only their deliveries and dead letters (403 for any other).", Default: "none"},
	"server.tokens[].name":   {Doc: "Unique name of the token, recorded as the actor in the audit log (the token itself never is)."},
	"server.tokens[].token":  {Doc: "The bearer token: at least 16 characters, different from every other token and from `admin_token`; from the environment (`\"${VAR}\"`) or a file (`\"file:/path\"`)."},
	"server.tokens[].prefix": {Doc: "The subscription name prefix the token is scoped to, e.g. `\"team-a-\"` (letters, digits, `_`, `.`, `-`)."},

	"subscriptions":                        {Doc: "Subscriptions that the teams receiving events create, change, pause and delete at runtime through `/api/v1/subscriptions`: a rule plus its own webhook sink each, stored in `mongo.state_database` and applied by every replica within seconds. This table, written by the operator, decides what the API may do; no request can change it."},
	"subscriptions.enabled":                {Doc: "Serve the subscriptions API and apply the stored subscriptions."},
	"subscriptions.key_file":               {Doc: "A file holding the key that encrypts the subscriptions' signing secrets at rest (AES-256-GCM): 32 random bytes, base64 (`openssl rand -base64 32`); relative to the config file. Alternatively the environment variable `CHANGEGATE_SECRET_KEY` holds it (not both). Without a key, creating subscriptions is refused.", Default: "`$CHANGEGATE_SECRET_KEY`"},
	"subscriptions.max_subscriptions":      {Doc: "The most subscriptions that may be stored; a create beyond it is refused."},
	"subscriptions.delete_grace":           {Doc: "How long what a deleted subscription parked or dead-lettered stays in the dead-letter store (readable at `GET /api/v1/deadletters?sink=NAME`) before every replica's purge loop removes it; the delete's answer gives the time (`purge_at`). `\"0s\"`: at once. Kept if a subscription or a sink of the file takes the name again before."},
	"subscriptions.allow_private_networks": {Doc: "Let subscriptions target loopback, private, link-local and cloud metadata addresses. Off, such URLs are refused when a subscription is created or changed, and at connection time."},
	"subscriptions.events_sink":            {Doc: "A `[[sinks]]` entry that receives the subscriptions' operational notices: `subscription.disabled` (by `disable_after`), `subscription.recovered` (resumed), `delivery.exhausted` (an event dead-lettered), as `{\"id\", \"type\", \"timestamp\", \"data\"}` envelopes, best effort ([operations](operations.md#operational-notices-events_sink)).", Default: "none"},

	"cluster":                   {Doc: "Running more than one replica: units of work shared through leases in MongoDB (see [running more than one](cluster.md))."},
	"cluster.enabled":           {Doc: "Turn lease-based sharing of the units on. Without it one process owns every unit and writes no lease."},
	"cluster.lease_ttl":         {Doc: "How long a lease lasts without renewal: a dead replica's units are taken over after about this long."},
	"cluster.renew_every":       {Doc: "How often an owner renews its leases; less than half of `lease_ttl`.", Default: "`lease_ttl` / 3"},
	"cluster.instance":          {Doc: "This replica's name in leases, logs, status and metrics; unique per replica.", Default: "`$HOSTNAME`, else a random id"},
	"cluster.leases_collection": {Doc: "Collection of lease and membership documents in `mongo.state_database`; must differ from the checkpoint and dead-letter collections."},

	"delivery_log":            {Doc: "The delivery log: one record per delivery attempt (per request for a batch, listing its event ids) with its outcome, status or error code, duration and an excerpt of the receiver's answer, never a payload; written off the delivery path, dropped and counted (`changegate_delivery_log_dropped_total`) when MongoDB cannot keep up."},
	"delivery_log.mode":       {Doc: "`\"failures\"`: every attempt that did not end in success (retries, parks, dead letters, skips by shaping); `\"all\"`: successes too; `\"off\"`: nothing."},
	"delivery_log.retention":  {Doc: "How long a record is kept: a TTL index (MongoDB removes expired records about once a minute).", Range: "1m to 2147483647s"},
	"delivery_log.collection": {Doc: "Collection of records in `mongo.state_database`; must differ from the other state collections."},

	"sources":                               {Doc: "One change stream each."},
	"sources[].name":                        {Doc: "Unique name (letters, digits, `_`, `.`, `-`). It is part of event ids and checkpoints: renaming a source restarts it from scratch."},
	"sources[].database":                    {Doc: "Database to watch; omit it (and `collection`) to watch the whole cluster (but `mongo.state_database`). The state database only with a `collection`."},
	"sources[].collection":                  {Doc: "Collection to watch; omit it to watch the whole database. Requires `database`."},
	"sources[].full_document":               {Doc: "What `fullDocument` holds for updates: nothing, the current document looked up, or the post-image (needs `changeStreamPreAndPostImages`)."},
	"sources[].full_document_before_change": {Doc: "The pre-image in `fullDocumentBeforeChange` (needs `changeStreamPreAndPostImages`)."},
	"sources[].pipeline":                    {Doc: "Extra change stream stages as an Extended JSON array; allowed: `$match $project $addFields $set $unset $replaceRoot $replaceWith $redact $changeStreamSplitLargeEvent` (the last one last)."},
	"sources[].start_at":                    {Doc: "Where the very first start begins (no checkpoint yet), within the oplog window. Not with `snapshot = \"initial\"`.", Type: "date-time", Range: "RFC 3339 string or TOML offset date-time", Default: "now"},
	"sources[].on_history_lost":             {Doc: "When the checkpoint has fallen off the oplog: exit non-zero and explain, or continue from now and record the gap as a dead letter."},
	"sources[].split_large_events":          {Doc: "`\"auto\"` adds `$changeStreamSplitLargeEvent` where the server has it and reassembles the fragments; `\"off\"` never does."},
	"sources[].on_oversize_event":           {Doc: "A change over 16 MB the server cannot split: stop the source, or record a gap dead letter and resume after it."},
	"sources[].batch_size":                  {Doc: "Change stream cursor batch size; 0 lets the server decide."},
	"sources[].max_await":                   {Doc: "How long the server waits for new changes before answering a getMore."},
	"sources[].max_in_flight_events":        {Doc: "Backpressure: events read but not yet delivered or dead-lettered; at the cap the source pauses."},
	"sources[].checkpoint_interval":         {Doc: "How often, at most, the checkpoint is persisted."},
	"sources[].partitions":                  {Doc: "Split the source into N units, each its own change stream (a hash of `documentKey`), checkpoint and lease."},
	"sources[].snapshot":                    {Doc: "`\"initial\"`: on the very first start deliver every existing document as a `snapshot` event, then the stream (see [snapshots](snapshots.md))."},

	"sinks":                        {Doc: "Where events go. The keys of this table apply to every sink type; the tables below list each type's own keys."},
	"sinks[].name":                 {Doc: "Unique name, used by rules, dead letters, logs and metrics."},
	"sinks[].type":                 {Doc: "The sink type.", Required: true},
	"sinks[].max_in_flight":        {Doc: "Concurrent requests: `\"auto\"` adapts the limit to the receiver within `max_in_flight_min`..`max_in_flight_max`; a number fixes it.", Type: "string or integer", Default: `"auto"`, Range: `"auto" or at least 1`},
	"sinks[].max_in_flight_min":    {Doc: "Lower bound of the adaptive limit (only with `\"auto\"`)."},
	"sinks[].max_in_flight_max":    {Default: "unset", Doc: "Upper bound of the adaptive limit (only with `\"auto\"`): an explicit cap on the requests (and connections) the receiver gets. Unset, the limit may rise to the sources' `max_in_flight_events`, within half the open-file limit shared by the sinks that leave it unset, and never below 1024; what the events in flight hold is bounded by `max_in_flight_bytes`."},
	"sinks[].rate_limit":           {Doc: "A token bucket of N requests per period: `\"500/s\"`, `\"30000/m\"`, `\"10/100ms\"`. Requests wait; nothing is dropped.", Default: "no limit"},
	"sinks[].circuit_max_cooldown": {Doc: "After 5 back-pressure failures in a row the circuit opens: one probe after 1s, doubling with every failed probe up to this ceiling, so a recovered receiver is seen within it.", Range: "1s to 1h"},
	"sinks[].rate_limit_burst":     {Doc: "Requests allowed at once after an idle spell; needs `rate_limit`.", Default: "one second's worth of `rate_limit`"},
	"sinks[].ordering":             {Doc: "`\"key\"`: a document's events in order, documents in parallel; `\"none\"`: any order; `\"strict\"`: one request at a time in stream order."},
	"sinks[].batch_size":           {Doc: "Events per request; above 1 a webhook or Lambda receives a JSON array."},
	"sinks[].batch_wait":           {Doc: "How long to wait for a batch to fill before sending a partial one (not at all when the sink's waiting events already fill it)."},
	"sinks[].json":                 {Doc: "Extended JSON flavour of the envelope (see [receivers](receivers.md))."},
	"sinks[].park_after":           {Doc: "Once the sink has failed to deliver for this long its backlog is parked in MongoDB and re-driven in order when it recovers; `\"0s\"` disables parking."},
	"sinks[].trace_context":        {Doc: "With OpenTelemetry tracing on (`OTEL_*` environment variables, see [tracing](tracing.md)), the trace context goes into each request or message: `traceparent`/`tracestate` (webhook headers, SQS and SNS message attributes, Kafka record headers), an X-Ray trace header (EventBridge `TraceHeader`, Lambda `X-Amzn-Trace-Id`); Kinesis records have none. `false` leaves it out; the spans are still recorded."},
	"sinks[].oversize":             {Doc: "An event whose payload alone exceeds `max_request_bytes`: dead-letter it, or send it stripped (see [payload shaping](shaping.md#payload-size-limits))."},
	"sinks[].transactions":         {Doc: "`\"group\"`: every event of one multi-document transaction routed to the sink goes out together (webhook, Lambda: one JSON array; other types: consecutive entries), and no later change of its documents before it; `\"none\"`: single events (see [transactions as a unit](delivery.md#transactions-as-a-unit))."},

	"sinks[].retry":                  {Doc: "Retry policy: exponential backoff with jitter; `Retry-After` is honoured."},
	"sinks[].retry.max_attempts":     {Doc: "Attempts in total, the first included."},
	"sinks[].retry.initial_interval": {Doc: "Delay before the first retry; at most `max_interval`."},
	"sinks[].retry.max_interval":     {Doc: "Largest delay between attempts."},
	"sinks[].retry.max_elapsed":      {Doc: "No new attempt starts this long after the first; `\"0s\"`: no limit."},
	"sinks[].retry.multiplier":       {Doc: "Growth factor of the delay."},
	"sinks[].retry.jitter":           {Doc: "Random spread of each delay, 0 (none) to 1 (plus or minus 100%)."},

	"sinks[].fields":                     {Doc: "A MongoDB projection of the document (paths start with `fullDocument.`): an inline table of paths to 0 or 1, or an array of paths to include.", Type: "table or array of strings"},
	"sinks[].redact":                     {Doc: "Paths whose values are replaced; `**` stands for any number of fields."},
	"sinks[].redact_mode":                {Doc: "`\"mask\"` writes `\"[REDACTED]\"`; `\"hash\"` writes the hex HMAC-SHA256 of the value under `redact_key`."},
	"sinks[].redact_key":                 {Doc: "The HMAC key of `redact_mode = \"hash\"`, at least 16 bytes."},
	"sinks[].envelope":                   {Doc: "`\"full\"`, `\"document\"` (the post-image alone, metadata beside it) or `\"key\"` (id, operationType, ns, documentKey)."},
	"sinks[].include_update_description": {Doc: "`false` leaves `updateDescription` out."},
	"sinks[].skip_empty_updates":         {Doc: "An update whose shaped changes are empty is not sent (it is acknowledged all the same)."},
	"sinks[].max_updated_fields_bytes":   {Doc: "Above this BSON size, shaped `updatedFields` becomes `{\"truncated\": true}`.", Default: "no limit"},

	"sinks[].url":                         {Doc: "The http or https endpoint events are POSTed to; a token in its path is kept secret in logs and status."},
	"sinks[].secret":                      {Doc: "Standard Webhooks signing secret (`whsec_` + base64, or raw), at least 24 bytes. Without one requests are not signed."},
	"sinks[].secrets":                     {Doc: "Several signing secrets during a rotation (each secret-capable); not with `secret`."},
	"sinks[].headers":                     {Doc: "Extra request headers, name to value (values are secret-capable).", Type: "table of strings"},
	"sinks[].bearer_token":                {Doc: "Sent as `Authorization: Bearer <token>`; not with `basic_auth`."},
	"sinks[].basic_auth":                  {Doc: "HTTP basic authentication: `{ username = ..., password = ... }`."},
	"sinks[].basic_auth.username":         {Doc: "User name (no `:`)."},
	"sinks[].basic_auth.password":         {Doc: "Password."},
	"sinks[].timeout":                     {Doc: "Timeout of one delivery (a webhook request, response included; all the requests of an AWS batch; a Kafka produce call with the client's own tries). A `RequestResponse` Lambda defaults to `\"1m\"`."},
	"sinks[].max_request_bytes":           {Doc: "Payload limit of one request (see [payload size limits](shaping.md#payload-size-limits)); a Lambda `RequestResponse` sink accepts up to 6291456, its default; Kafka: the record batch limit, default 1000012, up to 1073741824, the topic's `max.message.bytes` winning when lower."},
	"sinks[].allow_private_networks":      {Doc: "Allow targets on loopback, private, link-local, metadata and other special-purpose addresses (refused by default at dial time, against SSRF)."},
	"sinks[].tls_ca_file":                 {Doc: "A PEM file of extra CA certificates to trust (relative to the config file)."},
	"sinks[].tls_insecure_skip_verify":    {Doc: "Do not verify the server certificate (never in production; refused without `allow_cleartext_credentials`)."},
	"sinks[].allow_cleartext_credentials": {Doc: "Accept, on this sink, credentials that cross the network in clear text or to an unverified server, which are refused otherwise (by `check` and `run` alike, naming the key and line): webhook `basic_auth`, `bearer_token` or an `Authorization` header to an `http://` URL; Kafka `sasl_mechanism` without `tls = true`; `tls_insecure_skip_verify = true`. For a test bench or a network that is encrypted below changegate."},
	"sinks[].auth":                        {Doc: "`\"aws_sigv4\"` signs every request with AWS Signature Version 4 (function URLs with `AWS_IAM`, API Gateway). The url is sent as written and signed as sent; a path with a `.` or `..` segment or `//` is refused (AWS normalizes it first, except for `s3`)."},
	"sinks[].aws_service":                 {Doc: "With `auth = \"aws_sigv4\"`: the signing name.", Default: `"lambda"`},
	"sinks[].region":                      {Doc: "AWS region (`us-east-1`). AWS sinks: default `AWS_REGION` or the shared profile's. Webhook (only with `auth`): default from a function URL or execute-api host."},
	"sinks[].role_arn":                    {Doc: "An IAM role to assume with STS on top of the default credential chain (webhook: only with `auth`)."},
	"sinks[].event_bus":                   {Doc: "Event bus name or ARN."},
	"sinks[].endpoint":                    {Doc: "Service endpoint override, e.g. LocalStack's `http://localhost:4566`."},
	"sinks[].source":                      {Doc: "Entry `Source` template: placeholders `{db}` `{coll}` `{operationType}` `{source}`; must not start with `aws.`.", Default: `"changegate.{source}"`},
	"sinks[].detail_type":                 {Doc: "Entry `DetailType` template, placeholders as for `source`.", Default: `"{db}.{coll}.{operationType}"`},
	"sinks[].resources":                   {Doc: "ARNs attached to every entry."},
	"sinks[].queue_url":                   {Doc: "The queue URL; set exactly one of `queue_url` and `queue_name`. A name ending in `.fifo` is a FIFO queue."},
	"sinks[].queue_name":                  {Doc: "The queue name, resolved with GetQueueUrl at first use."},
	"sinks[].message_group_id":            {Doc: "FIFO queues and topics only: dotted path of the event field whose value is the MessageGroupId.", Default: "namespace and document key"},
	"sinks[].stream":                      {Doc: "The Kinesis data stream's name or ARN."},
	"sinks[].partition_key":               {Doc: "Dotted path of the event field whose value is the record's partition key (hashed to `sha256:<hex>` over 256 characters).", Default: "namespace and document key"},
	"sinks[].topic_arn":                   {Doc: "The SNS topic's ARN; a name ending in `.fifo` is a FIFO topic."},
	"sinks[].invocation_type":             {Doc: "`\"Event\"` (asynchronous) or `\"RequestResponse\"` (synchronous: the function's result decides)."},
	"sinks[].function":                    {Doc: "Function name, name:alias, ARN or partial ARN."},
	"sinks[].qualifier":                   {Doc: "A version or alias to invoke."},
	"sinks[].client_context":              {Doc: "A JSON object passed to synchronous invocations as the client context (at most 3583 bytes base64-encoded)."},
	"sinks[].brokers":                     {Doc: "Kafka seed brokers, `host:port` (at least one)."},
	"sinks[].topic":                       {Doc: "Kafka topic template: literal `[A-Za-z0-9._-]` and `{db}`, `{coll}`, `{source}` (no `{operationType}`: a document's changes share a topic). See [Kafka](kafka.md)."},
	"sinks[].tls":                         {Doc: "Kafka: connect to the brokers with TLS (system roots plus `tls_ca_file`); the other `tls_*` keys need it."},
	"sinks[].tls_cert_file":               {Doc: "Kafka: a PEM client certificate (with `tls_key_file`; relative to the config file)."},
	"sinks[].tls_key_file":                {Doc: "Kafka: the PEM key of `tls_cert_file`."},
	"sinks[].sasl_mechanism":              {Doc: "Kafka SASL mechanism, as Kafka names it; `sasl_username` and `sasl_password` are then required.", Default: "none"},
	"sinks[].sasl_username":               {Doc: "Kafka SASL user name (secret-capable)."},
	"sinks[].sasl_password":               {Doc: "Kafka SASL password (secret-capable)."},

	"rules":              {Doc: "Which events of a source go to which sinks. An event matched by several rules goes once to each sink and names every rule that matched."},
	"rules[].name":       {Doc: "Unique name, listed in the envelope's `rules`."},
	"rules[].source":     {Doc: "The source whose events this rule looks at."},
	"rules[].operations": {Doc: "Operation types to match: `insert update replace delete drop rename dropDatabase invalidate snapshot`.", Default: "all"},
	"rules[].namespaces": {Doc: "For database and cluster sources: `\"db.coll\"` or `\"db.*\"` patterns.", Default: "all"},
	"rules[].filter":     {Doc: "A MongoDB query over the change event as an inline table (`$eq $ne $gt $gte $lt $lte $in $nin $exists $and $or $not $regex ...`); pushed down into the stream where possible.", Type: "table"},
	"rules[].sinks":      {Doc: "Sinks the matching events go to (at least one)."},
}

// ruleShapeKeys are documented once, on [[sinks]]: a rule takes the same
// shaping keys.
var shapeKeys = []string{"fields", "redact", "redact_mode", "redact_key", "envelope", "include_update_description", "skip_empty_updates", "max_updated_fields_bytes"}

// docFor returns the documentation of a key, following rules[].X to
// sinks[].X for the shaping keys.
func docFor(path string) (keyDoc, bool) {
	if d, ok := keyDocs[path]; ok {
		return d, true
	}
	if k, ok := strings.CutPrefix(path, "rules[]."); ok && slices.Contains(shapeKeys, k) {
		d, ok := keyDocs["sinks[]."+k]
		return d, ok
	}
	return keyDoc{}, false
}

// refKey is a Key with its documentation overrides applied.
func refKey(k Key) (Key, keyDoc) {
	d, _ := docFor(k.Path)
	if d.Type != "" {
		k.Type = d.Type
	}
	if d.Default != "" && !(k.Path == "sinks[].timeout" || k.Path == "sinks[].max_request_bytes") {
		k.Default = d.Default
	}
	if d.Range != "" {
		k.Range = d.Range
	}
	k.Required = k.Required || d.Required
	return k, d
}

// leaf returns path relative to table when it is a key of that table
// (basic_auth's keys count as keys of [[sinks]]).
func leaf(path, table string) (string, bool) {
	rest, ok := strings.CutPrefix(path, table+".")
	if !ok {
		return "", false
	}
	if strings.Contains(rest, ".") && !strings.HasPrefix(rest, "basic_auth.") {
		return "", false
	}
	return rest, true
}

const tableHead = "| key | type | default | accepted | description |\n|---|---|---|---|---|\n"

func renderReference(keys []Key) []byte {
	var b bytes.Buffer
	b.WriteString(`<!-- Generated by "go generate ./config" from config.Describe (the keys the decoder accepts) and the
descriptions in config/reference_test.go. Do not edit: a test fails when this file is stale. -->

# Configuration reference

This page is for looking up a key: every key ` + "`changegate check`" + ` accepts, with its type, default and
accepted values, generated from the decoder itself so that it cannot drift from the code.
[config.example.toml](../config.example.toml) shows them all in one commented file; the other pages
of [the documentation](README.md) explain what the features do.

- The file is TOML. Unknown keys, wrong types and out-of-range values are errors; ` + "`changegate check -config FILE`" + `
  reports every one with its ` + "`file:line`" + `, without connecting to anything.
- Strings may reference environment variables: ` + "`\"${VAR}\"`" + ` (an error when ` + "`VAR`" + ` is unset) or
  ` + "`\"${VAR:-fallback}\"`" + ` (fallback when unset or empty); ` + "`$${`" + ` is a literal ` + "`${`" + `.
- Keys marked **secret** also accept ` + "`\"file:/path\"`" + `, which reads the value from that file (trailing
  newline removed; a relative path is relative to the config file). Secrets are never printed.
- Durations are strings such as ` + "`\"500ms\"`, `\"10s\"`, `\"1m\"`, `\"1h30m\"`" + `.

`)
	intro := func(path string) {
		if d, ok := docFor(path); ok {
			b.WriteString(d.Doc + "\n\n")
		}
	}
	plain := func(title, table, path string) {
		fmt.Fprintf(&b, "## `%s`\n\n", title)
		intro(path)
		if table == "rules[]" {
			b.WriteString("A rule also takes the payload-shaping keys of `[[sinks]]` (`" + strings.Join(shapeKeys, "`, `") +
				"`); where a rule and a sink both shape an event, the stricter applies.\n\n")
		}
		b.WriteString(tableHead)
		for _, k := range keys {
			name, ok := leaf(k.Path, table)
			if !ok || table == "rules[]" && slices.Contains(shapeKeys, name) {
				continue
			}
			b.WriteString(row(name, k))
		}
		b.WriteString("\n")
	}
	b.WriteString("## Top level\n\nKeys written before the first table.\n\n" + tableHead)
	for _, k := range keys {
		if !strings.ContainsAny(k.Path, ".[") && k.Type != "table" && k.Type != "array of tables" {
			b.WriteString(row(k.Path, k))
		}
	}
	b.WriteString("\n")
	plain("[mongo]", "mongo", "mongo")
	plain("[server]", "server", "server")
	plain("[[server.tokens]]", "server.tokens[]", "server.tokens")
	plain("[cluster]", "cluster", "cluster")
	plain("[delivery_log]", "delivery_log", "delivery_log")
	plain("[[sources]]", "sources[]", "sources")

	b.WriteString("## `[[sinks]]`\n\n")
	intro("sinks")
	b.WriteString("### Every sink type\n\n" + tableHead)
	for _, k := range keys {
		if name, ok := leaf(k.Path, "sinks[]"); ok && k.SinkTypes == nil && name != "retry" {
			b.WriteString(row(name, k))
		}
	}
	b.WriteString("\n")
	for _, t := range builtinSinkTypes() {
		fmt.Fprintf(&b, "### %s\n\nKeys of `type = %q` sinks besides those of every type.\n\n%s", t.name, t.name, tableHead)
		for _, k := range keys {
			if name, ok := leaf(k.Path, "sinks[]"); ok && slices.Contains(k.SinkTypes, t.name) {
				b.WriteString(row(name, k))
			}
		}
		b.WriteString("\n")
	}
	plain("[sinks.retry]", "sinks[].retry", "sinks[].retry")
	plain("[[rules]]", "rules[]", "rules")
	plain("[subscriptions]", "subscriptions", "subscriptions")
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

var literalRE = regexp.MustCompile(`^(-?[0-9.]+|true|false|"[^"` + "`" + `]*")$`)

// code formats a default or a range bound as code when it is a TOML literal.
func code(s string) string {
	if literalRE.MatchString(s) {
		return "`" + s + "`"
	}
	return s
}

func row(name string, k Key) string {
	k, d := refKey(k)
	typ := k.Type
	if k.Secret {
		typ += ", **secret**"
	}
	def := code(k.Default)
	if k.Required {
		def = "required"
	}
	rng := k.Range
	if strings.HasPrefix(rng, `"`) {
		parts := strings.Split(rng, ", ")
		for i := range parts {
			parts[i] = code(parts[i])
		}
		rng = strings.Join(parts, ", ")
	}
	return fmt.Sprintf("| `%s` | %s | %s | %s | %s |\n", name, cell(typ), cell(def), cell(rng), cell(d.Doc))
}

func TestConfigurationReference(t *testing.T) {
	keys := Describe()
	for _, k := range keys {
		d, ok := docFor(k.Path)
		if !ok || d.Doc == "" {
			t.Errorf("config key %s has no description: add it to keyDocs in config/reference_test.go, then run go generate ./config", k.Path)
		}
		if k, _ := refKey(k); k.Type == "" {
			t.Errorf("config key %s: the decoder reads it by hand, so its type is unknown: set Type in its keyDocs entry (config/reference_test.go)", k.Path)
		}
	}
	accepted := map[string]bool{}
	for _, k := range keys {
		accepted[k.Path] = true
	}
	for p := range keyDocs {
		if !accepted[p] {
			t.Errorf("keyDocs (config/reference_test.go) describes %s, which the decoder does not accept: remove it", p)
		}
	}
	got := renderReference(keys)
	if *update {
		if err := os.WriteFile(referenceFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(referenceFile)
	if err != nil {
		t.Fatalf("%v: run go generate ./config", err)
	}
	if !bytes.Equal(got, want) {
		gl, wl := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
		for i := 0; i < max(len(gl), len(wl)); i++ {
			var g, w string
			if i < len(gl) {
				g = gl[i]
			}
			if i < len(wl) {
				w = wl[i]
			}
			if g != w {
				t.Fatalf("docs/configuration.md is stale: run go generate ./config (first difference at line %d)\n  generated: %s\n  committed: %s", i+1, g, w)
			}
		}
	}
}
