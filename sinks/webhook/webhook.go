// Package webhook is the sink that POSTs events to an HTTP endpoint, signed
// per the Standard Webhooks specification
// (https://github.com/standard-webhooks/standard-webhooks).
//
// Each request carries the event's cached JSON envelope (or, when batching,
// a JSON array of envelopes) and the headers webhook-id, webhook-timestamp
// and webhook-signature. The sink makes one delivery attempt per Send:
// go-retryablehttp retries only connection-level failures of that attempt,
// a couple of times with short waits; every HTTP status is classified into a
// *sinks.Error and handed back to the delivery engine, which owns backoff
// and dead-lettering.
//
// Failures are *sinks.Error values with these reasons:
//
//   - "http_<status>": 3xx (redirects are not followed) and 4xx other than
//     408 and 429 are permanent; 408, 429, 5xx (and any other non-2xx
//     status) are retryable, with Retry-After (delay seconds or an HTTP
//     date) in RetryAfter.
//   - "transport": connection refused, reset, closed early...; retryable,
//     and already retried by go-retryablehttp up to 2 times with short
//     waits, each try re-signed.
//   - "timeout": the request exceeded Config.Timeout; retryable, left to the
//     engine (the server may still be working on it).
//   - "tls": certificate verification failed or the server does not speak
//     TLS; retryable (an operator may fix the certificate), left to the
//     engine.
//   - "forbidden_target": the address is refused by the private-network
//     guard; permanent, the message names the address.
//   - "encode": the envelope cannot be encoded; permanent.
//   - "oversize": the envelope alone makes a request body larger than
//     Config.MaxRequestBytes (even stripped, with Config.Oversize.Strip);
//     permanent, no request is made.
//
// When ctx ends, Send returns ctx's error (wrapped), not a *sinks.Error.
//
// With Config.SigV4 every request is also signed with AWS Signature Version
// 4 (sigv4.go), after the Standard Webhooks headers, for a Lambda function
// URL with AuthType AWS_IAM or an IAM-protected API Gateway API; failing to
// get credentials is retryable, reason "credentials".
//
// Security defaults: TLS certificates are verified; redirects are not
// followed; proxies from the environment (HTTP_PROXY, HTTPS_PROXY) are not
// used, because the private-network guard checks the address actually
// dialled and behind a proxy that would be the proxy's; targets resolving to
// cloud metadata addresses or to any range of the IANA IPv4 and IPv6
// special-purpose registries (loopback, private, link-local, CGNAT,
// documentation, benchmarking, reserved, IPv4-compatible, Teredo,
// site-local, ...; NAT64 and 6to4 by the IPv4 address they embed), and
// multicast, are refused at dial time unless Config.AllowPrivateNetworks.
package webhook

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/memory"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/confcheck"
	"github.com/changegate/changegate/tracing"
)

// Defaults and limits.
const (
	// DefaultTimeout bounds one request when Config.Timeout is 0.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxConns is the connection pool size when Config.MaxConns is 0.
	DefaultMaxConns = 64
	// DefaultMaxRequestBytes is the default byte cap of a batch request.
	DefaultMaxRequestBytes = 1 << 20
	// DefaultUserAgent is sent when Config.UserAgent is empty.
	DefaultUserAgent = "changegate-webhook"

	// respSnippetCap is how much of an error response body is read and
	// quoted (at most snippetMax bytes of it) in the error message.
	respSnippetCap = 4 << 10
	snippetMax     = 512
	// respDrainCap is how much of a response body is read, then discarded,
	// so that the connection can be reused; a body longer than that is
	// abandoned and its connection closed.
	respDrainCap = 64 << 10

	// Transport-level retries of one attempt (connection failures only).
	transportRetries = 2
	transportWaitMin = 50 * time.Millisecond
	transportWaitMax = 500 * time.Millisecond
)

// Config configures a webhook sink.
type Config struct {
	// Name is the sink name, used in errors and logs.
	Name string
	// URL is the http or https endpoint events are POSTed to.
	URL string
	// Secrets are the Standard Webhooks signing secrets: "whsec_<base64>"
	// (the key is the decoded base64) or any other string (the key is its
	// bytes). Every secret signs every request, which allows rotation.
	// Empty: requests carry no webhook-signature header.
	Secrets []string
	// Headers are extra request headers. They cannot replace Content-Type,
	// Content-Length, Host or the webhook-* headers; an Authorization
	// header conflicts with BearerToken and BasicUser.
	Headers map[string]string
	// BearerToken, when set, is sent as "Authorization: Bearer <token>".
	BearerToken string
	// BasicUser and BasicPassword, when BasicUser is set, are sent as HTTP
	// basic authentication. Exclusive with BearerToken.
	BasicUser, BasicPassword string
	// Timeout bounds one request attempt, from dialling to reading the
	// response body (default 10s).
	Timeout time.Duration
	// Canonical selects canonical instead of relaxed Extended JSON.
	Canonical bool
	// BatchSize is the maximum number of events per request. 1 (or 0)
	// sends each envelope as a JSON object; > 1 sends a JSON array of
	// envelopes, also for a batch of one.
	BatchSize int
	// MaxRequestBytes caps the body of one request (default
	// DefaultMaxRequestBytes): Send splits a larger batch into several
	// requests, in order. An event whose envelope alone makes a larger body
	// follows Oversize. A batch request answered 413 is split in halves and
	// the parts are sent again, down to single events, before any event is
	// given up.
	MaxRequestBytes int
	// Oversize is the policy for an event whose envelope alone exceeds
	// MaxRequestBytes (sinks.Oversize.Fit): failed with reason "oversize"
	// (the zero value), or sent stripped.
	Oversize sinks.Oversize
	// AllowPrivateNetworks permits targets that resolve to cloud metadata
	// addresses or to the IANA special-purpose ranges (see the package
	// doc), loopback and private networks included.
	AllowPrivateNetworks bool
	// TLSCAFile is a PEM file of CA certificates trusted in addition to the
	// system pool.
	TLSCAFile string
	// TLSInsecureSkipVerify disables server certificate verification.
	TLSInsecureSkipVerify bool
	// MaxConns sizes the connection pool: the number of idle connections
	// kept to the endpoint (default 64). It should be at least the sink's
	// concurrency (max_in_flight); more concurrent requests than that
	// still proceed but their connections are not kept.
	MaxConns int
	// UserAgent is the User-Agent header (default "changegate-webhook").
	UserAgent string
	// SigV4, when non-nil, signs every request with AWS Signature Version
	// 4 (see sigv4.go); exclusive with BearerToken, BasicUser and an
	// Authorization header.
	SigV4 *SigV4
}

// Webhook is a sinks.Sink that POSTs envelopes to one URL. It is safe for
// concurrent use by several workers.
type Webhook struct {
	name      string
	what      string // "webhook <name>", for Oversize.Fit's messages
	canonical bool
	maxBatch  int
	batching  bool
	maxBytes  int
	oversize  sinks.Oversize

	reqTemplate *http.Request // Method, URL, Host; shallow-copied per request
	target      string        // DisplayURL of the URL, for messages
	static      []headerKV    // precomputed headers, copied into each request (a list: no map iteration)
	signer      *signer       // nil: unsigned
	aws         *awsSigner    // nil: no SigV4

	transport *http.Transport
	overload  *overloadWatch
	timeout   time.Duration
	client    *retryablehttp.Client
	log       *slog.Logger

	now     func() time.Time
	tsCache atomic.Pointer[tsEntry]
	closed  atomic.Bool
}

var _ sinks.Sink = (*Webhook)(nil)

// headerKV is one of the headers every request carries (staticHeaders).
type headerKV struct {
	k string
	v []string
}

// tsEntry caches the header value of one unix second.
type tsEntry struct {
	sec int64
	s   string
	hv  []string
}

// New returns a webhook sink for cfg. It validates the configuration and
// builds the HTTP client; it does not connect. logger may be nil.
func New(cfg Config, logger *slog.Logger) (*Webhook, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	errs := confcheck.New("webhook", cfg.Name)

	u, err := url.Parse(cfg.URL)
	switch {
	case cfg.URL == "":
		errs.Addf("url is required")
	case err != nil:
		errs.Addf("url: %v", errors.Unwrap(err)) // url.Error would repeat the URL
	case u.Scheme != "http" && u.Scheme != "https":
		errs.Addf("url: scheme must be http or https, got %q", u.Scheme)
	case u.Host == "" || u.Hostname() == "":
		errs.Addf("url: no host")
	case u.Fragment != "":
		errs.Addf("url: must not have a #fragment")
	}
	if cfg.Timeout < 0 {
		errs.Addf("timeout must not be negative, got %s", cfg.Timeout)
	}
	if cfg.BatchSize < 0 {
		errs.Addf("batch_size must be >= 1, got %d", cfg.BatchSize)
	}
	if cfg.MaxRequestBytes < 0 {
		errs.Addf("max_request_bytes must be >= 1, got %d", cfg.MaxRequestBytes)
	}
	if cfg.MaxConns < 0 {
		errs.Addf("max_conns must be >= 1, got %d", cfg.MaxConns)
	}
	if cfg.BearerToken != "" && cfg.BasicUser != "" {
		errs.Addf("bearer_token and basic auth are exclusive")
	}
	sg, err := newSigner(cfg.Secrets)
	if err != nil {
		errs.Addf("%v", err)
	}
	as, err := newAWSSigner(cfg)
	errs.Add(err)
	static, err := staticHeaders(cfg)
	errs.Add(err)
	tlsCfg, err := tlsConfig(cfg)
	errs.Add(err)
	if err := errs.Err(); err != nil {
		return nil, err
	}

	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	maxConns := cfg.MaxConns
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	batch := max(cfg.BatchSize, 1)

	dialer := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if !cfg.AllowPrivateNetworks {
		dialer.Control = guardControl
	}
	ow := &overloadWatch{dial: dialer.DialContext}
	tr := &http.Transport{
		Proxy:                  nil, // never from the environment, see the package doc
		DialContext:            ow.dialContext,
		TLSClientConfig:        tlsCfg,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           maxConns,
		MaxIdleConnsPerHost:    maxConns,
		MaxConnsPerHost:        0, // concurrency is bounded by the engine's workers
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    min(timeout, 10*time.Second),
		ExpectContinueTimeout:  time.Second,
		DisableCompression:     true, // response bodies are not used
		MaxResponseHeaderBytes: 64 << 10,
	}
	if batch > 1 {
		// A batch body is tens of KiB: with the default 4 KiB buffer the
		// write path allocates a fresh 32 KiB copy buffer per request.
		tr.WriteBufferSize = 64 << 10
	}

	w := &Webhook{
		name:      cfg.Name,
		what:      "webhook " + cfg.Name,
		canonical: cfg.Canonical,
		maxBatch:  batch,
		batching:  batch > 1,
		maxBytes:  cmp.Or(cfg.MaxRequestBytes, DefaultMaxRequestBytes),
		oversize:  cfg.Oversize,
		target:    DisplayURL(u),
		signer:    sg,
		aws:       as,
		transport: tr,
		overload:  ow,
		timeout:   timeout,
		log:       logger,
		now:       time.Now,
	}
	for k, v := range static {
		w.static = append(w.static, headerKV{k, v})
	}
	w.reqTemplate = &http.Request{
		Method:     http.MethodPost,
		URL:        u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Host:       u.Host,
	}
	w.client = &retryablehttp.Client{
		HTTPClient: &http.Client{
			// The transport is wrapped so that retryablehttp's
			// CloseIdleConnections after a failed request does not tear
			// down the whole pool (every other worker's connections).
			Transport: poolKeeper{tr},
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
		Logger:       nil, // its logger is per request and unleveled; we log in checkRetry
		RetryWaitMin: transportWaitMin,
		RetryWaitMax: transportWaitMax,
		RetryMax:     transportRetries,
		CheckRetry:   w.checkRetry,
		Backoff:      retryablehttp.DefaultBackoff,
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
		PrepareRetry: w.prepareRetry,
	}
	return w, nil
}

// DisplayURL returns u as it may appear in logs, errors, /api/v1/status and
// dead letters: the scheme and host, and instead of a path (or query) its
// fingerprint, the first 8 hex digits of the SHA-256 of path and query —
// a path can carry a secret (Slack- or Discord-style hook URLs). Different
// paths show different fingerprints; nothing of the path can be read back.
// Credentials (user:password@) are never shown.
func DisplayURL(u *url.URL) string {
	base := u.Scheme + "://" + u.Host
	rest := u.EscapedPath()
	if u.RawQuery != "" {
		rest += "?" + u.RawQuery
	}
	if rest == "" || rest == "/" {
		return base + rest
	}
	sum := sha256.Sum256([]byte(rest))
	return base + "/[path sha256:" + hex.EncodeToString(sum[:4]) + "]"
}

// poolKeeper hides http.Transport's CloseIdleConnections from http.Client
// (and so from retryablehttp); Webhook.Close closes the pool itself.
type poolKeeper struct{ tr *http.Transport }

func (p poolKeeper) RoundTrip(r *http.Request) (*http.Response, error) { return p.tr.RoundTrip(r) }

// Headers of a document-form payload (envelope = "document"): the body is
// the post-image alone and the event's metadata travels in these (the id
// is HeaderID). A value that is not printable ASCII (a document key with
// other characters) is sent as "base64:" and the standard base64 of its
// UTF-8 bytes.
const (
	HeaderOperationType = "Changegate-Operation-Type"
	HeaderNamespace     = "Changegate-Namespace"
	HeaderDocumentKey   = "Changegate-Document-Key"
	HeaderClusterTime   = "Changegate-Cluster-Time"
	// HeaderTxn carries the "txn" object (compact JSON) of an event written
	// by a multi-document transaction.
	HeaderTxn = "Changegate-Txn"
)

// metaHeaders maps event.Event.Metadata names to headers.
var metaHeaders = map[string]string{
	"operationType": HeaderOperationType, "ns": HeaderNamespace,
	"documentKey": HeaderDocumentKey, "clusterTime": HeaderClusterTime, "txn": HeaderTxn,
}

// setMetaHeaders sets the metadata headers of a document-form payload.
func setMetaHeaders(h http.Header, e *event.Event) {
	for _, m := range e.Metadata() {
		name, ok := metaHeaders[m.Name]
		if !ok {
			continue
		}
		v := m.Value
		for i := 0; i < len(v); i++ {
			if v[i] < 0x20 || v[i] > 0x7e {
				v = "base64:" + base64.StdEncoding.EncodeToString([]byte(m.Value))
				break
			}
		}
		h[name] = []string{v}
	}
}

// reservedHeaders cannot be set through Config.Headers.
var reservedHeaders = map[string]bool{
	HeaderOperationType: true, HeaderNamespace: true, HeaderDocumentKey: true, HeaderClusterTime: true, HeaderTxn: true,
	HeaderID: true, HeaderTimestamp: true, HeaderSignature: true,
	"Content-Type": true, "Content-Length": true, "Transfer-Encoding": true,
	"Host": true, "Connection": true, "Te": true, "Upgrade": true, "Trailer": true,
}

// staticHeaders returns the headers every request carries, canonicalised
// and validated, so that requests copy them without further work.
func staticHeaders(cfg Config) (http.Header, error) {
	var errs []error
	h := http.Header{
		"Content-Type": {"application/json"},
		"User-Agent":   {DefaultUserAgent},
	}
	if cfg.UserAgent != "" {
		h["User-Agent"] = []string{cfg.UserAgent}
	}
	for name, value := range cfg.Headers {
		k := http.CanonicalHeaderKey(name)
		switch {
		case !validHeaderName(name):
			errs = append(errs, fmt.Errorf("headers: %q is not a valid header name", name))
			continue
		case reservedHeaders[k]:
			errs = append(errs, fmt.Errorf("headers: %s is set by the sink and cannot be overridden", k))
			continue
		case k == "Authorization" && (cfg.BearerToken != "" || cfg.BasicUser != ""):
			errs = append(errs, errors.New("headers: Authorization conflicts with bearer_token/basic auth"))
			continue
		case strings.ContainsAny(value, "\r\n\x00"):
			errs = append(errs, fmt.Errorf("headers: value of %s contains a line break or NUL", k))
			continue
		}
		h[k] = []string{value}
	}
	switch {
	case cfg.BearerToken != "":
		if strings.ContainsAny(cfg.BearerToken, "\r\n\x00") {
			errs = append(errs, errors.New("bearer_token contains a line break or NUL"))
		}
		h["Authorization"] = []string{"Bearer " + cfg.BearerToken}
	case cfg.BasicUser != "":
		if strings.Contains(cfg.BasicUser, ":") {
			errs = append(errs, errors.New("basic auth username must not contain ':'"))
		}
		h["Authorization"] = []string{"Basic " + base64.StdEncoding.EncodeToString([]byte(cfg.BasicUser+":"+cfg.BasicPassword))}
	}
	return h, errors.Join(errs...)
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

func tlsConfig(cfg Config) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.TLSInsecureSkipVerify} //nolint:gosec // opt-in
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls_ca_file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls_ca_file %s: no PEM certificate found", cfg.TLSCAFile)
		}
		c.RootCAs = pool
	}
	return c, nil
}

// Name returns the sink name.
func (w *Webhook) Name() string { return w.name }

// MaxBatch returns Config.BatchSize (at least 1).
func (w *Webhook) MaxBatch() int { return w.maxBatch }

// Close closes idle connections. Requests in progress are not interrupted
// (cancel their contexts for that); no Send may follow Close.
func (w *Webhook) Close() error {
	w.closed.Store(true)
	w.transport.CloseIdleConnections()
	return nil
}

// Send delivers batch in one request: the event's envelope, or a JSON array
// of envelopes when the sink batches. It returns nil on a 2xx answer and
// otherwise a *sinks.Error (retryable or permanent, see the package
// documentation), or ctx's error, wrapped, when ctx ends first.
//
// A sink that does not batch, given several events, sends them one by one
// and reports failures in a *sinks.BatchError. An event whose envelope
// cannot be encoded fails permanently (reason "encode"); in a batch, the
// other events are still sent and the failure is reported in a
// *sinks.BatchError.
func (w *Webhook) Send(ctx context.Context, batch []*event.Event) error {
	switch {
	case len(batch) == 0:
		return nil
	case w.closed.Load():
		// Retryable: during shutdown the engine will not retry, and a
		// programming error must not dead-letter events.
		return sinks.Retryable("closed", 0, fmt.Errorf("webhook %s: send after close", w.name))
	case sinks.TxnGroup(ctx):
		return w.sendGroup(ctx, batch)
	case !w.batching:
		if len(batch) == 1 {
			return w.sendOne(ctx, batch[0])
		}
		return w.sendEach(ctx, batch)
	default:
		return w.sendBatch(ctx, batch)
	}
}

func (w *Webhook) sendOne(ctx context.Context, e *event.Event) error {
	env, err := sinks.EncodeEnvelope(e, w.canonical)
	if err != nil {
		return sinks.Permanent("encode", fmt.Errorf("webhook %s: %w", w.name, err))
	}
	p, err := w.oversize.Fit(e, w.canonical, env, w.maxBytes, bodyLen, w.what, "request body")
	if err != nil {
		return err
	}
	release := sinks.Hold(ctx, int64(p.Built())) // a stripped body, made for this Send
	err = w.post(ctx, e.ID, oneBody(p.Body), e)
	release()
	w.oversize.Delivered([]bool{p.Stripped}, err)
	return err
}

// bodyLen is the size of the request body of a single envelope.
func bodyLen(env []byte) int { return len(env) }

// arrayBodyLen is the size of the request body of a batch of one envelope.
func arrayBodyLen(env []byte) int { return len(env) + 2 }

func (w *Webhook) sendEach(ctx context.Context, batch []*event.Event) error {
	var failed map[int]error
	for i, e := range batch {
		if err := w.sendOne(ctx, e); err != nil {
			if ctx.Err() != nil {
				return err
			}
			if failed == nil {
				failed = make(map[int]error)
			}
			failed[i] = err
		}
	}
	if failed != nil {
		return &sinks.BatchError{Failed: failed}
	}
	return nil
}

// sendBatch sends batch as JSON arrays of at most maxBytes each, in order
// (an event whose envelope alone makes a larger array follows the oversize
// policy); a request answered 413 is split and its parts sent again
// (postParts).
//
// The bodies are built as the envelopes are encoded: each envelope is
// appended to its request's array (event.Event.AppendRecord: the envelope
// of an event routed to this sink alone is encoded straight into the
// array, any other is copied from its event's cache), so a request is the
// one copy of its envelopes. The bodies are charged to the byte budget
// until Send returns.
func (w *Webhook) sendBatch(ctx context.Context, batch []*event.Event) (err error) {
	failed := map[int]error{}
	stripped := make([]bool, len(batch))
	defer func() { w.oversize.Delivered(stripped, err) }()
	built := 0 // stripped envelopes made for this Send, held until it returns
	var chunks []batchChunk
	spans := make([][2]int, len(batch)) // envelope i in its chunk's body
	cur := w.newChunk(batch)
	size := 2 // []
	for i, e := range batch {
		mark := len(cur.body)
		if len(cur.idx) > 0 {
			cur.body = append(cur.body, ',')
		}
		start := len(cur.body)
		// An array element has no headers of its own: a document-form
		// payload goes as its record (the metadata beside fullDocument).
		out, err := e.AppendRecord(cur.body, w.canonical)
		if err != nil {
			cur.body = cur.body[:mark]
			failed[i] = sinks.Permanent("encode", fmt.Errorf("webhook %s: %w", w.name, err))
			continue
		}
		p, err := w.oversize.Fit(e, w.canonical, out[start:], w.maxBytes, arrayBodyLen, w.what, "request body")
		if err != nil {
			cur.body = out[:mark]
			failed[i] = err
			continue
		}
		env := p.Body // out[start:], or a stripped envelope
		stripped[i] = p.Stripped
		built += p.Built()
		switch {
		case len(cur.idx) > 0 && size+len(env)+1 > w.maxBytes:
			// The envelope starts the next request (it is copied there;
			// ']' at mark, closing this one, does not overwrite it).
			cur.body = out[:mark]
			chunks = append(chunks, cur)
			cur, size = w.newChunk(batch[i:]), 2
			start = len(cur.body)
			cur.body = append(cur.body, env...)
		case p.Stripped:
			cur.body = append(out[:start], env...)
		default:
			cur.body = out
		}
		spans[i] = [2]int{start, len(cur.body)}
		cur.idx = append(cur.idx, i)
		size += len(env) + 1
	}
	if len(cur.idx) > 0 {
		chunks = append(chunks, cur)
	}
	envs := make([][]byte, len(batch))
	for k := range chunks {
		c := &chunks[k]
		c.body = append(c.body, ']')
		built += cap(c.body)
		for _, i := range c.idx {
			envs[i] = c.body[spans[i][0]:spans[i][1]:spans[i][1]]
		}
	}
	defer sinks.Hold(ctx, int64(built))()
	for _, c := range chunks {
		if err := w.postParts(ctx, batch, envs, c.idx, c.body, failed); err != nil {
			return err
		}
	}
	if len(failed) == 0 {
		return nil
	}
	// One error for every entry (one request that failed as a whole, say):
	// return it as is.
	var only error
	for _, err := range failed {
		if only == nil {
			only = err
		} else if err != only {
			only = nil
			break
		}
	}
	if only != nil && len(failed) == len(batch) {
		return only
	}
	return &sinks.BatchError{Failed: failed}
}

// batchChunk is one request of a batch being built by sendBatch: the
// indexes of its events and its body, '[' and their envelopes separated by
// ',' (sendBatch appends the ']').
type batchChunk struct {
	idx  []int
	body []byte
}

// newChunk starts a request for (at most) the events of batch, its body
// sized for their envelopes (appends grow it when that is not enough).
func (w *Webhook) newChunk(batch []*event.Event) batchChunk {
	n := 2
	for _, e := range batch {
		// Relaxed Extended JSON of a typical change is about its BSON's
		// size, canonical a third more (typed numbers and dates).
		r := len(e.Raw)
		if w.canonical {
			r += r / 2
		} else {
			r += r / 8
		}
		n += r + 32
		if n >= w.maxBytes {
			n = w.maxBytes
			break
		}
	}
	b := make([]byte, 0, n)
	return batchChunk{idx: make([]int, 0, len(batch)), body: append(b, '[')}
}

// sendGroup sends the events of one transaction (sinks.WithTxnGroup) as
// one JSON array, whatever the sink's batch size. An array larger than
// max_request_bytes is split in order into parts of at most that size, each
// element's "txn" then carrying "part" and "parts"; the parts are posted one
// after the other, and once one fails the later ones are not sent: they
// fail with the same error, so that a refused part (a permanent failure)
// dead-letters every later part with it at once (sinks.NotSent). An event whose
// envelope alone is too large follows the oversize policy and is left out
// (a permanent failure in the returned *sinks.BatchError).
func (w *Webhook) sendGroup(ctx context.Context, batch []*event.Event) (err error) {
	failed := map[int]error{}
	envs := make([][]byte, len(batch))
	sizes := make([]int, len(batch))
	ok := make([]bool, len(batch))
	stripped := make([]bool, len(batch))
	defer func() { w.oversize.Delivered(stripped, err) }()
	built := 0
	for i, e := range batch {
		env, err := sinks.EncodeRecord(e, w.canonical)
		if err != nil {
			failed[i] = sinks.Permanent("encode", fmt.Errorf("webhook %s: %w", w.name, err))
			continue
		}
		p, err := w.oversize.Fit(e, w.canonical, env, w.maxBytes-event.TxnPartReserve, arrayBodyLen, w.what, "request body")
		if err != nil {
			failed[i] = err
			continue
		}
		envs[i], sizes[i], ok[i], stripped[i] = p.Body, len(p.Body), true, p.Stripped
		built += p.Built()
	}
	pre := len(failed) // left out before any request
	// Split when too large: every element then says which part it is in.
	parts, marked := sinks.SplitTxn(batch, envs, sizes, ok, w.maxBytes)
	built += marked
	defer sinks.Hold(ctx, int64(built))()
	var callErr error
	for _, idx := range parts {
		if callErr != nil {
			nerr := sinks.NotSent("webhook "+w.name, callErr, true)
			for _, i := range idx {
				failed[i] = nerr
			}
			continue
		}
		ps := make([][]byte, len(idx))
		ids := make([]string, len(idx))
		for j, i := range idx {
			ps[j], ids[j] = envs[i], batch[i].ID
		}
		body := arrayBody(ps) // the one copy of the request, see reqBody
		mem := memory.FromContext(ctx).Force(int64(body.n))
		perr := w.post(ctx, BatchID(ids), body, nil)
		mem.Release()
		if perr != nil {
			if ctx.Err() != nil {
				return perr
			}
			callErr = perr
			for _, i := range idx {
				failed[i] = perr
			}
		}
	}
	switch {
	case len(failed) == 0:
		return nil
	case pre == 0 && len(parts) == 1 && callErr != nil:
		return callErr // the one request failed as a whole
	}
	return &sinks.BatchError{Failed: failed}
}

// postParts posts the envelopes at idx as one JSON array and records a
// failure per entry in failed. A 413 (Content Too Large) on more than one
// envelope splits them in halves, sent one after the other the same way,
// so only an event that is refused on its own is given up. It returns an
// error only when ctx ended.
//
// joined, if not nil, is the array of the envelopes at idx, built by
// sendBatch (and charged by it): it is sent as is. Otherwise the envelopes
// are joined into one (a part of a split request), charged to the byte
// budget while it is sent. Retries of the request, its signature and the
// HTTP client's rewinds read the body in place.
func (w *Webhook) postParts(ctx context.Context, batch []*event.Event, envs [][]byte, idx []int, joined []byte, failed map[int]error) error {
	ids := make([]string, len(idx))
	for j, i := range idx {
		ids[j] = batch[i].ID
	}
	var body reqBody
	release := func() {}
	if joined != nil {
		body = oneBody(joined) // a prebuilt array is one slice of bytes
	} else {
		parts := make([][]byte, len(idx))
		for j, i := range idx {
			parts[j] = envs[i]
		}
		body = arrayBody(parts)
		release = memory.FromContext(ctx).Force(int64(body.n)).Release
	}
	err := w.post(ctx, BatchID(ids), body, nil)
	release()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	var se *sinks.Error
	if len(idx) > 1 && errors.As(err, &se) && se.Reason == "http_413" {
		w.log.DebugContext(ctx, "webhook batch too large for the receiver, splitting it", "events", len(idx), "bytes", body.n)
		mid := len(idx) / 2
		if err := w.postParts(ctx, batch, envs, idx[:mid], nil, failed); err != nil {
			return err
		}
		return w.postParts(ctx, batch, envs, idx[mid:], nil, failed)
	}
	for _, i := range idx {
		failed[i] = err
	}
	return nil
}

// BatchID returns the webhook-id of a batch request: "batch_" followed by
// the unpadded base64url of the first 18 bytes of the SHA-256 of the event
// ids, each followed by a NUL byte. It is stable: a re-delivery of the same
// events in the same order carries the same id, so receivers can
// de-duplicate batches as they de-duplicate single events; the events' own
// ids are in the envelopes ("id").
func BatchID(ids []string) string {
	n := 0
	for _, id := range ids {
		n += len(id) + 1
	}
	buf := make([]byte, 0, n) // one hash call: io.WriteString on a hash copies each id
	for _, id := range ids {
		buf = append(append(buf, id...), 0)
	}
	sum := sha256.Sum256(buf)
	var out [6 + 24]byte
	copy(out[:], "batch_")
	base64.RawURLEncoding.Encode(out[6:], sum[:18])
	return string(out[:])
}

// post makes one delivery attempt of body under message id.
func (w *Webhook) post(parent context.Context, id string, b reqBody, e *event.Event) error {
	// One allocation for what the attempt keeps: its body (prepareRetry
	// finds it through the request's context) and the values of the id
	// and signature headers.
	a := &struct {
		body reqBody
		vals [2]string
	}{body: b}
	body := &a.body
	// The timeout is a context rather than http.Client.Timeout: same
	// coverage (dial to end of body), a third of the allocations. It bounds
	// the attempt including go-retryablehttp's quick connection retries.
	ctx, cancel := context.WithTimeout(parent, w.timeout)
	defer cancel()
	// body is not copied: go-retryablehttp makes a new reader of it for
	// each try (and GetBody), and prepareRetry signs the same bytes, found
	// through the request's context.
	ctx = context.WithValue(ctx, bodyKey{}, body)
	hr := w.reqTemplate.WithContext(ctx)
	h := make(http.Header, len(w.static)+3)
	for _, kv := range w.static {
		h[kv.k] = kv.v // shared read-only slices; prepareRetry clones before changing
	}
	vals := a.vals[:]
	vals[0] = id
	h[HeaderID] = vals[0:1:1]
	tracing.InjectHTTP(parent, h) // traceparent, tracestate: the attempt's span
	if e != nil && e.Form() == event.FormDocument {
		setMetaHeaders(h, e)
	}
	w.sign(h, id, body, vals[1:2:2])
	hr.Header = h
	if w.aws != nil {
		hr.ContentLength = int64(body.n)
		if err := w.aws.sign(ctx, hr, body.sha256Hex()); err != nil {
			if parent.Err() != nil {
				return fmt.Errorf("webhook %s: POST %s: %w", w.name, w.target, parent.Err())
			}
			return sinks.Retryable("credentials", 0, fmt.Errorf("webhook %s: sigv4: %w", w.name, err))
		}
	}
	req, err := retryablehttp.FromRequest(hr)
	if err == nil {
		if body.array {
			err = req.SetBody(retryablehttp.ReaderFunc(body.reader))
		} else {
			err = req.SetBody(body.one) // a new bytes.Reader of it per try
		}
	}
	if err != nil {
		return sinks.Permanent("request", fmt.Errorf("webhook %s: build request: %w", w.name, err))
	}
	// The last moment before the request is written: a batch of a unit
	// whose lease ended meanwhile (cluster mode) is not sent.
	if err := sinks.CheckFence(ctx); err != nil {
		return fmt.Errorf("webhook %s: POST %s: %w", w.name, w.target, err)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return w.transportError(parent, err)
	}
	tracing.SetHTTPStatus(parent, resp.StatusCode)
	return w.classify(resp)
}

// bodyKey is the request context key of the body post sends.
type bodyKey struct{}

// sign sets the timestamp and signature headers for one attempt. slot, if
// not nil, is a one-element slice the signature header's value is stored in.
func (w *Webhook) sign(h http.Header, id string, body *reqBody, slot []string) {
	ts := w.timestamp()
	h[HeaderTimestamp] = ts.hv
	if w.signer != nil {
		var buf [128]byte
		if slot == nil {
			slot = make([]string, 1)
		}
		slot[0] = string(w.signer.appendSignatures(buf[:0], id, ts.s, body))
		h[HeaderSignature] = slot
	}
}

// timestamp returns the cached header value of the current unix second.
func (w *Webhook) timestamp() *tsEntry {
	sec := w.now().Unix()
	if e := w.tsCache.Load(); e != nil && e.sec == sec {
		return e
	}
	s := strconv.FormatInt(sec, 10)
	e := &tsEntry{sec: sec, s: s, hv: []string{s}}
	w.tsCache.Store(e)
	return e
}

// prepareRetry re-signs a request before go-retryablehttp retries it: a new
// timestamp and signature for every attempt. The request is a shallow copy
// of the previous attempt's, so the header map is cloned first (the
// previous attempt's may still be read by the transport).
func (w *Webhook) prepareRetry(r *http.Request) error {
	if err := sinks.CheckFence(r.Context()); err != nil {
		return err // the unit's lease ended: no transport retry either
	}
	h := r.Header.Clone()
	r.Header = h
	// The body post sent, not a copy read back through GetBody.
	body, _ := r.Context().Value(bodyKey{}).(*reqBody)
	w.sign(h, h.Get(HeaderID), body, nil)
	if w.aws != nil {
		// A new date and signature over the new webhook-timestamp; the
		// body, and so its hash, is the same.
		return w.aws.sign(r.Context(), r, h.Get("X-Amz-Content-Sha256"))
	}
	return nil
}

// checkRetry is go-retryablehttp's retry policy: only connection-level
// failures that another try may fix are retried here. Every response is
// returned to Send as is (the engine owns retries of HTTP statuses); so are
// timeouts (the server may be processing: the engine backs off), TLS
// verification failures and refused targets.
func (w *Webhook) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if err == nil || ctx.Err() != nil {
		return false, nil
	}
	if _, retry := transportReason(err); !retry {
		return false, nil
	}
	if refusedOrReset(err) {
		w.overload.signal(time.Now())
	}
	if w.log.Enabled(ctx, slog.LevelDebug) {
		w.log.DebugContext(ctx, "webhook transport error, retrying request", "error", unwrapURLError(err))
	}
	return true, nil
}

// transportReason returns the sinks.Error reason of a transport error and
// whether go-retryablehttp may retry it at once.
func transportReason(err error) (reason string, retry bool) {
	var ne net.Error
	var certInvalid x509.CertificateInvalidError
	var unknownAuth x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var verify *tls.CertificateVerificationError
	var recordHdr tls.RecordHeaderError
	switch {
	case errors.Is(err, ErrForbiddenTarget):
		return "forbidden_target", false
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout", false
	case errors.As(err, &verify), errors.As(err, &certInvalid), errors.As(err, &unknownAuth),
		errors.As(err, &hostname), errors.As(err, &recordHdr):
		return "tls", false
	}
	return "transport", true
}

func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err // url.Error's text repeats the URL, query string included
	}
	return err
}

// transportError turns an error of client.Do into the error Send returns.
func (w *Webhook) transportError(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("webhook %s: POST %s: %w", w.name, w.target, cerr)
	}
	reason, _ := transportReason(err)
	if reason == "forbidden_target" {
		var fe *forbiddenTargetError
		errors.As(err, &fe)
		return sinks.Permanent(reason, fmt.Errorf("webhook %s: POST %s: %w", w.name, w.target, fe))
	}
	return sinks.Retryable(reason, 0, fmt.Errorf("webhook %s: POST %s: %w", w.name, w.target, unwrapURLError(err)))
}

// classify reads (up to a cap) and closes resp's body and turns its status
// into Send's result.
func (w *Webhook) classify(resp *http.Response) error {
	code := resp.StatusCode
	if code >= 200 && code <= 299 {
		drain(resp.Body)
		return nil
	}
	answer := readAnswer(resp.Body)
	drain(resp.Body)
	snippet := ""
	if answer != "" {
		snippet = ": " + truncate(answer, snippetMax)
	}

	// The reason phrase is the receiver's text: no control characters
	// (terminal escapes) in what logs, dead letters and the CLI show.
	status := sinks.Printable(resp.Status)
	if status == "" {
		status = strconv.Itoa(code)
	}
	msg := fmt.Sprintf("webhook %s: POST %s: HTTP %s", w.name, w.target, status)
	reason := "http_" + strconv.Itoa(code)
	switch {
	case code >= 300 && code <= 399:
		if loc := resp.Header.Get("Location"); loc != "" {
			shown := "an unparsable location"
			if lu, err := url.Parse(loc); err == nil {
				shown = DisplayURL(w.reqTemplate.URL.ResolveReference(lu))
			}
			msg += fmt.Sprintf(" (redirect to %s not followed: webhooks do not follow redirects, configure the final URL)", shown)
		} else {
			msg += " (redirects are not followed)"
		}
		return answered(sinks.Permanent(reason, errors.New(msg+snippet)), code, answer)
	case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500 || code < 200:
		ra := retryAfter(resp.Header.Get("Retry-After"), w.now())
		if ra > 0 {
			msg += " (retry after " + ra.String() + ")"
		}
		return answered(sinks.Retryable(reason, ra, errors.New(msg+snippet)), code, answer)
	default: // other 4xx
		return answered(sinks.Permanent(reason, errors.New(msg+snippet)), code, answer)
	}
}

// answered sets the status and answer of the receiver's answer on de.
func answered(de *sinks.Error, status int, answer string) *sinks.Error {
	de.Status, de.Answer = status, answer
	return de
}

// retryAfter parses a Retry-After value: delay seconds or an HTTP date
// (relative to now). Invalid, negative or past values yield 0.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(24*time.Hour/time.Second) { // absurd; the retry policy caps it anyway
			secs = int64(24 * time.Hour / time.Second)
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return min(d, 24*time.Hour)
		}
	}
	return 0
}

// readAnswer reads up to respSnippetCap bytes of body and returns them as
// an answer's excerpt (sinks.Answer; "" when empty).
func readAnswer(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, respSnippetCap))
	return sinks.Answer(b)
}

// truncate shortens s to at most n bytes (on a rune boundary), marking the
// cut with "...".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// drain reads what is left of body up to respDrainCap, so that the
// connection can be reused, and closes it.
func drain(body io.ReadCloser) {
	if body != http.NoBody { // http.NoBody: no Content-Length or an empty one
		_, _ = io.CopyN(io.Discard, body, respDrainCap)
	}
	_ = body.Close()
}
