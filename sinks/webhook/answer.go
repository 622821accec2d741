package webhook

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/changegate/changegate/sinks"
)

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
