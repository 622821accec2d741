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
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/sinks/internal/confcheck"
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
	ow := &overloadWatch{dial: dialer.DialContext, dialing: make(chan struct{}, maxDialing)}
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
