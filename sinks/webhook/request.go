package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/changegate/changegate/event"
	"github.com/changegate/changegate/sinks"
	"github.com/changegate/changegate/tracing"
)

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
