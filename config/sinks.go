package config

import (
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"math"
	"net/textproto"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/changegate/changegate/sinks/kafka"
	"github.com/changegate/changegate/sinks/limit"
)

// sinkType describes one sink type: its name, its largest batch and how to
// decode its type-specific options into a Sink. Adding a sink type means
// adding a field to Sink, an options struct and an entry here.
type sinkType struct {
	name         string
	maxBatchSize int64
	// defaultBatchSize is batch_size when unset (0 means 1).
	defaultBatchSize int64
	// decode reads the type-specific keys of o into s. It must ask o for
	// every key of the type (even when others are invalid), because the
	// keys it asks for are what the type accepts.
	decode func(d *decoder, o *obj, s *Sink)
}

// builtinSinkTypes returns the sink types, in the order they are listed in
// error messages.
func builtinSinkTypes() []sinkType {
	return []sinkType{
		{name: SinkWebhook, maxBatchSize: 1000, decode: decodeWebhook},
		{name: SinkEventBridge, maxBatchSize: 10, defaultBatchSize: 10, decode: decodeEventBridge},
		{name: SinkSQS, maxBatchSize: 10, defaultBatchSize: 10, decode: decodeSQS},
		{name: SinkLambda, maxBatchSize: 1000, decode: decodeLambda},
		{name: SinkKinesis, maxBatchSize: MaxKinesisBatchSize, defaultBatchSize: MaxKinesisBatchSize, decode: decodeKinesis},
		{name: SinkSNS, maxBatchSize: 10, defaultBatchSize: 10, decode: decodeSNS},
		{name: SinkKafka, maxBatchSize: kafka.MaxRecords, defaultBatchSize: DefaultKafkaBatchSize, decode: decodeKafka},
	}
}

var (
	orderings   = []string{string(OrderingKey), string(OrderingNone), string(OrderingStrict)}
	jsonFormats = []string{string(JSONRelaxed), string(JSONCanonical)}
)

// sinkTypeKeys returns the keys each sink type accepts, found by decoding an
// empty table with a throw-away decoder.
func (d *decoder) sinkTypeKeys() map[string][]string {
	keys := map[string][]string{}
	for _, t := range d.sinkTypes {
		scratch := &decoder{file: d.file, lookupEnv: d.lookupEnv}
		o := scratch.obj("", &value{kind: kindTable, tbl: newTable()})
		t.decode(scratch, o, &Sink{})
		keys[t.name] = o.known
	}
	return keys
}

// sink decodes one [[sinks]] entry; nameVal is nil when the name is missing
// or invalid.
func (d *decoder) sink(o *obj) (s Sink, nameVal *value) {
	if d.rec != nil {
		// Describe mode: record this entry's keys under its type.
		if v := o.t.get("type"); v != nil {
			d.rec.variant = v.str
		}
		defer func() { d.rec.variant = "" }()
	}
	s.Name, nameVal = o.name()
	var typeNames []string
	for _, t := range d.sinkTypes {
		typeNames = append(typeNames, t.name)
	}
	s.Type = o.enum("type", "", typeNames)
	if o.t.get("type") == nil {
		o.missing("type")
	}
	var typ *sinkType
	for i := range d.sinkTypes {
		if d.sinkTypes[i].name == s.Type {
			typ = &d.sinkTypes[i]
		}
	}

	d.concurrency(o, &s)
	s.Ordering = Ordering(o.enum("ordering", string(OrderingKey), orderings))
	maxBatch, defBatch := int64(math.MaxInt32), int64(1)
	if typ != nil {
		maxBatch = typ.maxBatchSize
		defBatch = max(typ.defaultBatchSize, 1)
	}
	s.BatchSize = int(o.integer("batch_size", defBatch, 1, maxBatch))
	s.BatchWait, _ = o.duration("batch_wait", 0, 0)
	s.JSON = JSONFormat(o.enum("json", string(JSONRelaxed), jsonFormats))
	s.ParkAfter, _ = o.duration("park_after", DefaultParkAfter, 0)
	s.Oversize = o.enum("oversize", OversizeDeadLetter, []string{OversizeDeadLetter, OversizeStrip})
	s.TraceContext = o.boolean("trace_context", true)
	s.Transactions = o.enum("transactions", TransactionsNone, []string{TransactionsNone, TransactionsGroup})
	s.Retry = d.retry(o)
	s.Shape = d.shape(o)

	typeKeys := d.sinkTypeKeys()
	if typ != nil {
		typ.decode(d, o, &s)
	} else {
		// Unknown or missing type (reported): accept every type's keys
		// silently rather than burying the real error.
		for _, keys := range typeKeys {
			for _, k := range keys {
				o.lookup(k)
			}
		}
	}
	o.foreign = func(k string) string {
		for _, t := range d.sinkTypes {
			if t.name == s.Type {
				continue
			}
			for _, tk := range typeKeys[t.name] {
				if tk == k {
					return fmt.Sprintf("not an option of %s sinks", s.Type)
				}
			}
		}
		return ""
	}
	o.done()
	return s, nameVal
}

// concurrency decodes max_in_flight ("auto" or a fixed number), its bounds
// and the rate limit.
func (d *decoder) concurrency(o *obj, s *Sink) {
	s.MaxInFlightMin, s.MaxInFlightMax = DefaultSinkMaxInFlightMin, DefaultSinkMaxInFlightMax
	auto := true
	if v := o.lookup("max_in_flight"); v != nil {
		switch v.kind {
		case kindInteger:
			auto = false
			s.MaxInFlight = int(o.integer("max_in_flight", 0, 1, math.MaxInt32))
		case kindString:
			if str, ok := d.expand(o.keyPath("max_in_flight"), v.line, v.str); ok && str != MaxInFlightAuto {
				d.errorf(o.keyPath("max_in_flight"), v.line, `must be %q or a number (without quotes), got %q`, MaxInFlightAuto, str)
			}
		default:
			o.typeError("max_in_flight", v, `"auto" or an integer`)
		}
	}
	maxVal := o.lookup("max_in_flight_max")
	for _, k := range []string{"max_in_flight_min", "max_in_flight_max"} {
		if v := o.t.get(k); v != nil && !auto {
			d.errorf(o.keyPath(k), v.line, `applies only when max_in_flight is %q`, MaxInFlightAuto)
			o.bad[k] = true
		}
	}
	if auto {
		s.MaxInFlightMin = int(o.integer("max_in_flight_min", DefaultSinkMaxInFlightMin, 1, math.MaxInt32))
		s.MaxInFlightMax = int(o.integer("max_in_flight_max", DefaultSinkMaxInFlightMax, 1, math.MaxInt32))
		// Without max_in_flight_max the ceiling is not a number of the
		// sink's own (see DefaultSinkMaxInFlightMax): nothing to compare.
		if maxVal != nil && s.MaxInFlightMin > s.MaxInFlightMax && !o.bad["max_in_flight_min"] && !o.bad["max_in_flight_max"] {
			d.errorf(o.keyPath("max_in_flight_max"), maxVal.line, "must not be less than max_in_flight_min (%d), got %d", s.MaxInFlightMin, s.MaxInFlightMax)
		}
	} else {
		s.MaxInFlightMin, s.MaxInFlightMax = 0, 0
	}

	if str, v, ok := o.str("rate_limit"); v != nil && ok {
		if r, err := limit.ParseRate(str); err != nil {
			o.bad["rate_limit"] = true
			d.errorf(o.keyPath("rate_limit"), v.line, "%v", err)
		} else {
			s.RateLimit = r
		}
	}
	var present bool
	s.CircuitMaxCooldown, present = o.duration("circuit_max_cooldown", DefaultSinkCircuitMaxCooldown, time.Second)
	if present && s.CircuitMaxCooldown > MaxSinkCircuitMaxCooldown {
		d.errorf(o.keyPath("circuit_max_cooldown"), o.lookup("circuit_max_cooldown").line, "must be at most %s, got %s", MaxSinkCircuitMaxCooldown, s.CircuitMaxCooldown)
		s.CircuitMaxCooldown = DefaultSinkCircuitMaxCooldown
	}
	burstVal := o.t.get("rate_limit_burst")
	burst := int(o.integer("rate_limit_burst", 0, 1, math.MaxInt32))
	switch {
	case burstVal != nil && o.t.get("rate_limit") == nil:
		d.errorf(o.keyPath("rate_limit_burst"), burstVal.line, "needs rate_limit")
	case s.RateLimit > 0 && burst > 0:
		s.RateLimitBurst = burst
	case s.RateLimit > 0:
		s.RateLimitBurst = limit.DefaultBurst(s.RateLimit)
	}
}

func (d *decoder) retry(sink *obj) Retry {
	r := Retry{
		MaxAttempts:     DefaultRetryMaxAttempts,
		InitialInterval: DefaultRetryInitialInterval,
		MaxInterval:     DefaultRetryMaxInterval,
		MaxElapsed:      DefaultRetryMaxElapsed,
		Multiplier:      DefaultRetryMultiplier,
		Jitter:          DefaultRetryJitter,
	}
	o := sink.sub("retry")
	if o == nil {
		return r
	}
	r.MaxAttempts = int(o.integer("max_attempts", DefaultRetryMaxAttempts, 1, math.MaxInt32))
	r.InitialInterval, _ = o.duration("initial_interval", DefaultRetryInitialInterval, time.Millisecond)
	var maxSet bool
	r.MaxInterval, maxSet = o.duration("max_interval", DefaultRetryMaxInterval, time.Millisecond)
	r.MaxElapsed, _ = o.duration("max_elapsed", DefaultRetryMaxElapsed, 0)
	r.Multiplier = o.float("multiplier", DefaultRetryMultiplier, 1, math.MaxFloat64)
	r.Jitter = o.float("jitter", DefaultRetryJitter, 0, 1)
	if r.InitialInterval > r.MaxInterval && !o.bad["initial_interval"] && !o.bad["max_interval"] {
		if maxSet {
			d.errorf(o.keyPath("max_interval"), o.lineOf("max_interval"), "must not be less than initial_interval (%s), got %s", r.InitialInterval, r.MaxInterval)
		} else {
			d.errorf(o.keyPath("initial_interval"), o.lineOf("initial_interval"), "must not be greater than max_interval (%s, the default), got %s", r.MaxInterval, r.InitialInterval)
		}
	}
	o.done()
	return r
}

// reservedHeaders are set by the webhook sink itself.
var reservedHeaders = []string{"Content-Length", "Host", "Webhook-Id", "Webhook-Signature", "Webhook-Timestamp",
	"Changegate-Operation-Type", "Changegate-Namespace", "Changegate-Document-Key", "Changegate-Cluster-Time"}

func decodeWebhook(d *decoder, o *obj, s *Sink) {
	w := &WebhookSink{}
	s.Webhook = w

	// The URL may carry a secret in its path (Slack- or Discord-style
	// hooks): like other secrets it may come from ${VAR} or a file:.
	if u, v := o.secret("url"); v == nil {
		o.missing("url")
	} else if !o.bad["url"] {
		if msg := checkHTTPURL(u.Value()); msg != "" {
			d.errorf(o.keyPath("url"), v.line, "%s", msg)
		}
		w.URL = u.Value()
	}

	secret, secretVal := o.secret("secret")
	if secretVal != nil && !o.bad["secret"] {
		if d.checkSigningSecret(o.keyPath("secret"), secretVal.line, secret) {
			w.Secrets = []Secret{secret}
		}
	}
	secrets, elems, secretsVal := o.strings("secrets")
	if secretsVal != nil && secretVal != nil {
		d.errorf(o.keyPath("secrets"), secretsVal.line, "cannot be combined with secret (use secrets alone during a rotation)")
	} else if secretsVal != nil && !o.bad["secrets"] {
		if len(secrets) == 0 {
			d.errorf(o.keyPath("secrets"), secretsVal.line, "must not be empty (omit it to send unsigned requests)")
		}
		for i, raw := range secrets {
			path := indexPath(o.keyPath("secrets"), i)
			if sec, ok := d.readSecret(path, elems[i].line, raw); ok && d.checkSigningSecret(path, elems[i].line, sec) {
				w.Secrets = append(w.Secrets, sec)
			}
		}
	}

	if h := o.sub("headers"); h != nil {
		seen := map[string]bool{}
		for _, k := range h.t.keys {
			sec, v := h.secret(k)
			path := h.keyPath(k)
			name := textproto.CanonicalMIMEHeaderKey(k)
			switch {
			case !isHeaderToken(k):
				d.errorf(path, v.line, "invalid header name %q", k)
			case contains(reservedHeaders, name):
				d.errorf(path, v.line, "header %s is set by changegate and cannot be overridden", name)
			case seen[name]:
				d.errorf(path, v.line, "header %s is set twice", name)
			case h.bad[k]:
			default:
				if strings.ContainsAny(sec.Value(), "\r\n\x00") {
					d.errorf(path, v.line, "header value must not contain line breaks")
					continue
				}
				w.Headers = append(w.Headers, Header{Name: name, Value: sec})
			}
			seen[name] = true
		}
		h.done()
	}

	w.BearerToken, _ = o.secret("bearer_token")
	if strings.ContainsAny(w.BearerToken.Value(), "\r\n\x00") {
		d.errorf(o.keyPath("bearer_token"), o.lineOf("bearer_token"), "must not contain line breaks")
	}
	for _, hd := range w.Headers {
		if hd.Name != "Authorization" {
			continue
		}
		for _, k := range []string{"bearer_token", "basic_auth"} {
			if o.t.get(k) != nil {
				h := o.sub("headers")
				key, line := "Authorization", 0
				for _, hk := range h.t.keys {
					if textproto.CanonicalMIMEHeaderKey(hk) == "Authorization" {
						key, line = hk, h.t.get(hk).line
					}
				}
				d.errorf(h.keyPath(key), line, "conflicts with %s (line %d): set the credentials once", k, o.lineOf(k))
			}
		}
	}
	if b := o.sub("basic_auth"); b != nil {
		if o.t.get("bearer_token") != nil {
			d.errorf(o.keyPath("basic_auth"), o.lineOf("basic_auth"), "cannot be combined with bearer_token")
		}
		user, _ := b.reqString("username")
		if strings.Contains(user, ":") {
			d.errorf(b.keyPath("username"), b.lineOf("username"), `must not contain ":" (HTTP basic authentication separates it from the password with one)`)
		}
		pw, pv := b.secret("password")
		if pv == nil {
			b.missing("password")
		}
		w.BasicAuth = &BasicAuth{Username: user, Password: pw}
		b.done()
	}
	w.Timeout, _ = o.duration("timeout", DefaultWebhookTimeout, time.Millisecond)
	w.MaxRequestBytes = int(o.integer("max_request_bytes", DefaultWebhookMaxRequestBytes, minMaxRequestBytes, MaxWebhookMaxRequestBytes))
	w.AllowPrivateNetworks = o.boolean("allow_private_networks", false)
	if f, v, ok := o.str("tls_ca_file"); v != nil && ok {
		w.TLSCAFile = d.resolvePath(f)
		if pem, err := os.ReadFile(w.TLSCAFile); err != nil {
			d.errorf(o.keyPath("tls_ca_file"), v.line, "cannot read CA file: %v", err)
		} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			d.errorf(o.keyPath("tls_ca_file"), v.line, "no PEM certificate found in %s", w.TLSCAFile)
		}
	}
	w.TLSInsecureSkipVerify = o.boolean("tls_insecure_skip_verify", false)
	d.webhookAuth(o, w)

	// Credentials in clear text and unverified certificates.
	c := d.cleartext(o)
	if u, err := url.Parse(w.URL); err == nil && u.Scheme == "http" {
		const https = "; use an https:// URL"
		if o.t.get("basic_auth") != nil {
			c.refuse("basic_auth", "the password is sent in clear text to an http:// URL"+https)
		}
		if o.t.get("bearer_token") != nil {
			c.refuse("bearer_token", "the token is sent in clear text to an http:// URL"+https)
		}
		if h := o.sub("headers"); h != nil {
			for _, k := range h.t.keys {
				if textproto.CanonicalMIMEHeaderKey(k) == "Authorization" {
					c.refuseAt(h.keyPath(k), h.t.get(k).line, "the credentials are sent in clear text to an http:// URL"+https)
				}
			}
		}
	}
	if w.TLSInsecureSkipVerify {
		c.refuse("tls_insecure_skip_verify", insecureSkipVerify)
	}
}

// insecureSkipVerify is the risk of tls_insecure_skip_verify = true.
const insecureSkipVerify = "the server's certificate is not verified: anyone on the network path can pose as the server and read what is sent, credentials included"

// cleartextCheck refuses, for one sink, the settings that let credentials
// cross the network in clear text or leave the server's certificate
// unverified, each at its key and line, unless the sink says
// allow_cleartext_credentials = true.
type cleartextCheck struct {
	d     *decoder
	o     *obj
	allow bool
}

// cleartext reads the sink's allow_cleartext_credentials.
func (d *decoder) cleartext(o *obj) cleartextCheck {
	return cleartextCheck{d: d, o: o, allow: o.boolean("allow_cleartext_credentials", false)}
}

// refuse refuses the sink's key k for risk (a sentence without the remedy).
func (c cleartextCheck) refuse(k, risk string) {
	c.refuseAt(c.o.keyPath(k), c.o.lineOf(k), risk)
}

func (c cleartextCheck) refuseAt(path string, line int, risk string) {
	if !c.allow {
		c.d.errorf(path, line, "%s (or set allow_cleartext_credentials = true on the sink to accept the risk)", risk)
	}
}

func checkHTTPURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return `must be an absolute http:// or https:// URL`
	}
	if u.Fragment != "" {
		return "must not have a #fragment"
	}
	return ""
}

// MinSigningSecretBytes is the shortest webhook signing key accepted
// (after base64 decoding of a "whsec_" secret), as the webhook sink
// requires.
const MinSigningSecretBytes = 24

// MinAdminTokenLength is the shortest server.admin_token accepted.
const MinAdminTokenLength = 16

// checkSigningSecret validates a Standard Webhooks secret: "whsec_" followed
// by base64 (padded or not), or any other string used as raw key bytes; the
// key must be at least MinSigningSecretBytes long.
func (d *decoder) checkSigningSecret(path string, line int, s Secret) bool {
	v := s.Value()
	if v == "" {
		d.errorf(path, line, "must not be empty")
		return false
	}
	key := []byte(v)
	if b64, ok := strings.CutPrefix(v, "whsec_"); ok {
		k, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			k, err = base64.RawStdEncoding.DecodeString(b64)
		}
		if err != nil || b64 == "" {
			d.errorf(path, line, `secret starting with "whsec_" must continue with standard base64`)
			return false
		}
		key = k
	}
	if len(key) < MinSigningSecretBytes {
		d.errorf(path, line, "the signing key is %d bytes, want at least %d random bytes (e.g. \"whsec_\" + the output of openssl rand -base64 32)", len(key), MinSigningSecretBytes)
		return false
	}
	return true
}

func isHeaderToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
