package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/changegate/changegate/event"
	awstest "github.com/changegate/changegate/test/aws"
)

// sigv4Receiver plays a function URL with AuthType AWS_IAM: it recomputes
// every request's SigV4 signature with test/aws's verifier (service
// "lambda", region eu-central-1) and answers 403 when it does not match.
type sigv4Receiver struct {
	mu   sync.Mutex
	errs []error
	reqs []recorded
}

func (s *sigv4Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	err := awstest.VerifySigV4(r, body, awstest.Options{Region: "eu-central-1"}, "lambda")
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.reqs = append(s.reqs, recorded{path: r.URL.Path, query: r.URL.RawQuery, header: r.Header.Clone(), body: body})
	s.mu.Unlock()
	if err != nil {
		http.Error(w, `{"Message":"Forbidden"}`, http.StatusForbidden)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *sigv4Receiver) results() ([]error, []recorded) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...), append([]recorded(nil), s.reqs...)
}

func sigv4Config(url, secretKey string) Config {
	return Config{
		URL: url, Secrets: []string{testSecret}, AllowPrivateNetworks: true, BatchSize: 2,
		SigV4: &SigV4{Service: "lambda", Region: "eu-central-1",
			Credentials: credentials.NewStaticCredentialsProvider(awstest.AccessKeyID, secretKey, "")},
	}
}

// A batch is signed with the Standard Webhooks signature and then SigV4
// over the final headers (webhook-* included) and the body's hash; a
// receiver recomputing the signature accepts it, and refuses a request
// signed with the wrong key.
func TestSigV4Signed(t *testing.T) {
	rcv := &sigv4Receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	evs := []*event.Event{testEvent(t, 1), testEvent(t, 2)}
	if err := newSink(t, sigv4Config(srv.URL+"/hooks?x=a%20b", awstest.SecretAccessKey)).Send(context.Background(), evs); err != nil {
		t.Fatalf("Send: %v", err)
	}
	errs, reqs := rcv.results()
	if len(reqs) != 1 || errs[0] != nil {
		t.Fatalf("%d requests, verification %v", len(reqs), errs)
	}
	r := reqs[0]
	if got := r.header.Get("X-Amz-Content-Sha256"); got != hexSHA256(r.body) {
		t.Errorf("X-Amz-Content-Sha256 = %q, want the body's SHA-256", got)
	}
	ts := r.header.Get("webhook-timestamp")
	if got, want := r.header.Get("webhook-signature"), independentSig(t, testSecret, r.header.Get("webhook-id"), ts, r.body); got != want {
		t.Errorf("webhook-signature = %s, want %s", got, want)
	}
	auth := r.header.Get("Authorization")
	for _, h := range []string{"content-length", "host", "webhook-id", "webhook-signature", "webhook-timestamp", "x-amz-content-sha256", "x-amz-date"} {
		if !strings.Contains(auth, h) {
			t.Errorf("header %s not signed: %s", h, auth)
		}
	}
	if !strings.Contains(auth, "/eu-central-1/lambda/aws4_request") {
		t.Errorf("scope: %s", auth)
	}

	err := newSink(t, sigv4Config(srv.URL, "wrong-secret")).Send(context.Background(), evs)
	if de := asSinkError(t, err); !de.Permanent || de.Reason != "http_403" {
		t.Errorf("wrong key: %v, want permanent http_403", err)
	}
	if errs, _ := rcv.results(); len(errs) != 2 || errs[1] == nil || !strings.Contains(errs[1].Error(), "signature we calculated does not match") {
		t.Errorf("verifier results %v, want the second request refused", errs)
	}
}

// A transport retry gets a new webhook-timestamp, so it is signed anew: the
// receiver accepts the retried request.
func TestSigV4TransportRetryResigns(t *testing.T) {
	rcv := &sigv4Receiver{}
	srv, ln := startDropFirstConn(t, rcv)
	cfg := sigv4Config(srv.URL, awstest.SecretAccessKey)
	cfg.BatchSize = 1
	w := newSink(t, cfg)
	var calls atomic.Int32
	w.now = func() time.Time { return time.Now().Add(time.Duration(calls.Add(1)-1) * 10 * time.Second) }
	if err := w.Send(context.Background(), []*event.Event{testEvent(t, 1)}); err != nil {
		t.Fatalf("Send: %v", err)
	}
	errs, reqs := rcv.results()
	if ln.accepted.Load() != 2 || len(reqs) != 1 || errs[0] != nil {
		t.Fatalf("%d connections, %d requests, verification %v", ln.accepted.Load(), len(reqs), errs)
	}
	if ts, _ := strconv.ParseInt(reqs[0].header.Get("webhook-timestamp"), 10, 64); ts < time.Now().Add(5*time.Second).Unix() {
		t.Errorf("webhook-timestamp %d is the first attempt's", ts)
	}
}

func TestSigV4ConfigErrors(t *testing.T) {
	base := sigv4Config("https://abc.lambda-url.eu-central-1.on.aws/", awstest.SecretAccessKey)
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.BearerToken = "t" }, "sigv4: exclusive with bearer_token and basic auth"},
		{func(c *Config) { c.Headers = map[string]string{"x-amz-date": "1"} }, "headers: X-Amz-Date is set by sigv4"},
		{func(c *Config) { c.SigV4 = &SigV4{Service: "lambda"} }, "sigv4: region is required"},
	} {
		cfg := base
		tc.mod(&cfg)
		if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v, want %q", err, tc.want)
		}
	}
}

// Concurrent requests of one sink (max_in_flight = 8) are signed each on
// their own copy of the URL: the signer's canonical query never reaches the
// shared request template (go test -race reported it), every request
// carries the query byte for byte as configured, and its signature
// verifies.
func TestSigV4ConcurrentQueryAsConfigured(t *testing.T) {
	rcv := &sigv4Receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	const query = "b=2&a=1&a=0&f=x+y&g"
	cfg := sigv4Config(srv.URL+"/hooks?"+query, awstest.SecretAccessKey)
	cfg.BatchSize = 1
	w := newSink(t, cfg)
	const workers, each = 8, 10
	var wg sync.WaitGroup
	errc := make(chan error, workers*each)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				errc <- w.Send(context.Background(), []*event.Event{testEvent(t, g*each+i)})
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	errs, reqs := rcv.results()
	if len(reqs) != workers*each {
		t.Fatalf("%d requests, want %d", len(reqs), workers*each)
	}
	for i, r := range reqs {
		if r.query != query || errs[i] != nil {
			t.Fatalf("request %d: query %q (want %q as configured), verification %v", i, r.query, query, errs[i])
		}
	}
	if got := w.reqTemplate.URL.RawQuery; got != query {
		t.Errorf("the request template's query is now %q", got)
	}
}

// hexSHA256 is SigV4's payload hash, computed independently of the sink.
func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
