package awstest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/smithy-go"
)

// fastRetryer is the SDK's standard retryer with the given attempts and no
// backoff delay, so retry tests run fast but classification is the SDK's.
func fastRetryer(attempts int) func() aws.Retryer {
	return func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.MaxAttempts = attempts
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})
	}
}

// clientConfig is the aws.Config of a test client of srv: srv.Config()
// with fastRetryer(attempts).
func clientConfig(srv interface{ Config() aws.Config }, attempts int) aws.Config {
	cfg := srv.Config()
	cfg.Retryer = fastRetryer(attempts)
	return cfg
}

// wrongSecretConfig is clientConfig(srv, 1) signing with a wrong secret
// key.
func wrongSecretConfig(srv interface{ Config() aws.Config }) aws.Config {
	cfg := clientConfig(srv, 1)
	cfg.Credentials = credentials.NewStaticCredentialsProvider(AccessKeyID, "wrong", "")
	return cfg
}

func ebClient(t *testing.T, eb *EventBridge, optFns ...func(*eventbridge.Options)) *eventbridge.Client {
	t.Helper()
	return eventbridge.NewFromConfig(clientConfig(eb, 3), optFns...)
}

func ebEntry(source, detail string) ebtypes.PutEventsRequestEntry {
	return ebtypes.PutEventsRequestEntry{
		Source:     aws.String(source),
		DetailType: aws.String("shop.orders.insert"),
		Detail:     aws.String(detail),
	}
}

func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func TestEventBridgePutEventsRoundTrip(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb)

	when := time.Date(2026, 11, 22, 5, 40, 43, 123e6, time.UTC)
	out, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{
		{
			EventBusName: aws.String("orders"),
			Source:       aws.String("changegate.shop"),
			DetailType:   aws.String("shop.orders.insert"),
			Detail:       aws.String(`{"id":"e1","n":1}`),
			Resources:    []string{"arn:aws:dynamodb:us-east-1:123456789012:table/x"},
			Time:         aws.Time(when),
		},
		ebEntry("changegate.shop", `{"id":"e2"}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if out.FailedEntryCount != 0 || len(out.Entries) != 2 {
		t.Fatalf("out = %+v", out)
	}
	got := eb.Events()
	if len(got) != 2 {
		t.Fatalf("events = %+v", got)
	}
	e := got[0]
	if e.EventID != aws.ToString(out.Entries[0].EventId) || e.EventID == "" {
		t.Errorf("event id %q vs response %q", e.EventID, aws.ToString(out.Entries[0].EventId))
	}
	if e.EventBusName != "orders" || e.Source != "changegate.shop" || e.DetailType != "shop.orders.insert" ||
		e.Detail != `{"id":"e1","n":1}` || len(e.Resources) != 1 || !e.Time.Equal(when) {
		t.Errorf("event = %+v", e)
	}
	if got[1].EventBusName != "default" || !got[1].Time.IsZero() {
		t.Errorf("second event = %+v", got[1])
	}
	if eb.Requests() != 1 || eb.Rejected() != 0 {
		t.Errorf("requests %d rejected %d", eb.Requests(), eb.Rejected())
	}
}

func TestEventBridgeWrongSecretRejected(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb, func(o *eventbridge.Options) {
		o.Credentials = credentials.NewStaticCredentialsProvider(AccessKeyID, "not-the-secret", "")
	})
	_, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}})
	if err == nil {
		t.Fatal("wrong secret accepted")
	}
	if apiCode(err) != "InvalidSignatureException" {
		t.Errorf("err = %v", err)
	}
	var re interface{ HTTPStatusCode() int }
	if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusForbidden {
		t.Errorf("status: %v", err)
	}
	if eb.Rejected() != 1 || eb.Requests() != 1 || len(eb.Events()) != 0 {
		t.Errorf("rejected %d requests %d events %d (signature errors are not retried)", eb.Rejected(), eb.Requests(), len(eb.Events()))
	}

	// Unknown access key, wrong region: also rejected.
	c = ebClient(t, eb, func(o *eventbridge.Options) {
		o.Credentials = credentials.NewStaticCredentialsProvider("AKIDSOMEONEELSE", SecretAccessKey, "")
	})
	_, err = c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}})
	if apiCode(err) != "UnrecognizedClientException" {
		t.Errorf("unknown key: %v", err)
	}
	c = ebClient(t, eb, func(o *eventbridge.Options) { o.Region = "eu-west-1" })
	_, err = c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}})
	if apiCode(err) != "InvalidSignatureException" {
		t.Errorf("wrong region: %v", err)
	}
	if eb.Rejected() != 3 {
		t.Errorf("rejected = %d", eb.Rejected())
	}
}

// signedRequest builds a PutEvents request signed by the SDK's signer at
// signTime with the given secret.
func signedRequest(t *testing.T, url, secret string, signTime time.Time, body string) *http.Request {
	t.Helper()
	return signedRequestFor(t, url, secret, "events", "AWSEvents.PutEvents", "application/x-amz-json-1.1", signTime, body)
}

// signedRequestFor builds a request signed by the SDK's signer for service
// at signTime.
func signedRequestFor(t *testing.T, url, secret, service, target, contentType string, signTime time.Time, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("X-Amz-Target", target)
	sum := sha256.Sum256([]byte(body))
	creds := aws.Credentials{AccessKeyID: AccessKeyID, SecretAccessKey: secret}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, req, hex.EncodeToString(sum[:]), service, DefaultRegion, signTime); err != nil {
		t.Fatal(err)
	}
	return req
}

func TestEventBridgeSignatureChecks(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	body := `{"Entries":[{"Source":"s","DetailType":"d","Detail":"{}"}]}`
	do := func(req *http.Request) (int, string) {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if st, b := do(signedRequest(t, eb.URL(), SecretAccessKey, time.Now(), body)); st != 200 {
		t.Fatalf("good request: %d %s", st, b)
	}
	// Clock skew beyond 5 minutes either way.
	for _, d := range []time.Duration{-6 * time.Minute, 6 * time.Minute} {
		st, b := do(signedRequest(t, eb.URL(), SecretAccessKey, time.Now().Add(d), body))
		if st != 400 || !strings.Contains(b, `"InvalidSignatureException"`) || !strings.Contains(b, "Signature") {
			t.Errorf("skew %v: %d %s", d, st, b)
		}
	}
	// Within the window.
	if st, b := do(signedRequest(t, eb.URL(), SecretAccessKey, time.Now().Add(-4*time.Minute), body)); st != 200 {
		t.Errorf("4m skew: %d %s", st, b)
	}
	// Tampered body after signing.
	req := signedRequest(t, eb.URL(), SecretAccessKey, time.Now(), body)
	tampered := strings.Replace(body, `"s"`, `"x"`, 1)
	req.Body = io.NopCloser(strings.NewReader(tampered))
	if st, b := do(req); st != 403 || !strings.Contains(b, "InvalidSignatureException") {
		t.Errorf("tampered body: %d %s", st, b)
	}
	// Tampered signed header.
	req = signedRequest(t, eb.URL(), SecretAccessKey, time.Now(), body)
	req.Header.Set("X-Amz-Target", "AWSEvents.PutRule")
	if st, b := do(req); st != 403 {
		t.Errorf("tampered header: %d %s", st, b)
	}
	// No signature at all.
	req, _ = http.NewRequest(http.MethodPost, eb.URL()+"/", bytes.NewReader([]byte(body)))
	req.Header.Set("X-Amz-Target", "AWSEvents.PutEvents")
	if st, b := do(req); st != 403 || !strings.Contains(b, "MissingAuthenticationToken") {
		t.Errorf("unsigned: %d %s", st, b)
	}
	if eb.Rejected() != 5 || len(eb.Events()) != 2 {
		t.Errorf("rejected %d events %d", eb.Rejected(), len(eb.Events()))
	}
}

func TestEventBridgeThrottleRetriedBySDK(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb)
	in := &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{"a":1}`)}}

	eb.Throttle(2)
	if _, err := c.PutEvents(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if eb.Requests() != 3 || len(eb.Events()) != 1 {
		t.Errorf("requests %d events %d", eb.Requests(), len(eb.Events()))
	}

	// Without the SDK retryer the error surfaces, classified as a throttle.
	eb.Reset()
	eb.Throttle(1)
	_, err := c.PutEvents(context.Background(), in, func(o *eventbridge.Options) { o.Retryer = aws.NopRetryer{} })
	if apiCode(err) != "ThrottlingException" {
		t.Fatalf("err = %v", err)
	}
	if !retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err).Bool() ||
		!retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err).Bool() {
		t.Errorf("not classified as retryable throttle: %v", err)
	}
	var te *ebtypes.ThrottlingException
	if !errors.As(err, &te) {
		t.Errorf("not a *types.ThrottlingException: %T", err)
	}
}

func TestEventBridgeFailStatus(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb)
	in := &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{"a":1}`)}}

	eb.FailStatus(1, 500)
	if _, err := c.PutEvents(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if eb.Requests() != 2 {
		t.Errorf("requests = %d", eb.Requests())
	}
	eb.FailStatus(5, 503)
	_, err := c.PutEvents(context.Background(), in)
	var re interface{ HTTPStatusCode() int }
	if err == nil || !errors.As(err, &re) || re.HTTPStatusCode() != 503 {
		t.Fatalf("err = %v", err)
	}
	if eb.Requests() != 5 {
		t.Errorf("requests = %d (3 attempts expected)", eb.Requests())
	}
	var ie *ebtypes.InternalException
	eb.Reset()
	eb.FailStatus(1, 500)
	_, err = c.PutEvents(context.Background(), in, func(o *eventbridge.Options) { o.Retryer = aws.NopRetryer{} })
	if !errors.As(err, &ie) {
		t.Errorf("500: %v", err)
	}
}

func TestEventBridgePartialFailure(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb)
	eb.FailEntries(func(e PutEventsEntry) (string, string) {
		if strings.Contains(e.Detail, "fail") {
			return "ThrottlingException", "Rate exceeded"
		}
		return "", ""
	})
	out, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{
		ebEntry("s", `{"n":0}`),
		ebEntry("s", `{"n":1,"fail":true}`),
		ebEntry("s", `[1,2]`),
		{DetailType: aws.String("d"), Detail: aws.String(`{}`)},
		ebEntry("s", `{"n":4}`),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if out.FailedEntryCount != 3 || len(out.Entries) != 5 {
		t.Fatalf("out = %+v", out)
	}
	want := []string{"", "ThrottlingException", "MalformedDetail", "InvalidArgument", ""}
	for i, w := range want {
		e := out.Entries[i]
		if aws.ToString(e.ErrorCode) != w || (w == "") != (e.EventId != nil) || (w != "") != (e.ErrorMessage != nil) {
			t.Errorf("entry %d = code %q id %v msg %v, want code %q", i, aws.ToString(e.ErrorCode), aws.ToString(e.EventId), aws.ToString(e.ErrorMessage), w)
		}
	}
	if got := eb.Events(); len(got) != 2 || got[0].Detail != `{"n":0}` || got[1].Detail != `{"n":4}` {
		t.Errorf("events = %+v", got)
	}
}

func TestEventBridgeRequestLimits(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb)

	var eleven []ebtypes.PutEventsRequestEntry
	for i := range 11 {
		eleven = append(eleven, ebEntry("s", fmt.Sprintf(`{"n":%d}`, i)))
	}
	_, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: eleven})
	if apiCode(err) != "ValidationException" {
		t.Errorf("11 entries: %v", err)
	}
	if _, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: eleven[:10]}); err != nil {
		t.Errorf("10 entries: %v", err)
	}

	// Exactly at the limit passes, one byte over fails.
	src, dt := "s", "shop.orders.insert"
	pad := DefaultEventBridgeMaxRequestSize - len(src) - len(dt) - len(`{"p":""}`) - 14
	at := ebEntry(src, `{"p":"`+strings.Repeat("x", pad)+`"}`)
	at.Time = aws.Time(time.Now())
	if _, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{at}}); err != nil {
		t.Errorf("at limit: %v", err)
	}
	over := ebEntry(src, `{"p":"`+strings.Repeat("x", pad+1)+`"}`)
	over.Time = aws.Time(time.Now())
	_, err = c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{over}})
	if apiCode(err) != "ValidationException" || !strings.Contains(err.Error(), "over the limit") {
		t.Errorf("over limit: %v", err)
	}
	if eb.Requests() != 4 {
		t.Errorf("requests = %d (validation errors are not retried)", eb.Requests())
	}
}

func TestEventBridgeStall(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb)
	eb.Stall(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}})
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("err = %v after %v", err, time.Since(start))
	}
	if len(eb.Events()) != 0 {
		t.Error("stalled request was processed")
	}
	eb.Stall(0)
	if _, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}}); err != nil {
		t.Fatal(err)
	}

	// Close releases a request that is still stalled.
	eb.Stall(time.Minute)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}},
			func(o *eventbridge.Options) { o.Retryer = aws.NopRetryer{} })
	}()
	for eb.Requests() < 3 {
		time.Sleep(5 * time.Millisecond)
	}
	eb.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release the stalled request")
	}
}

func TestEventBridgeClockSkewCorrectedBySDK(t *testing.T) {
	// The server clock is 10 minutes ahead: the first attempt is rejected as
	// expired, the SDK reads the skew from the Date header and re-signs.
	eb := NewEventBridge(Options{Now: func() time.Time { return time.Now().Add(10 * time.Minute) }})
	defer eb.Close()
	c := ebClient(t, eb)
	if _, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}}); err != nil {
		t.Fatal(err)
	}
	if eb.Requests() != 2 || eb.Rejected() != 1 || len(eb.Events()) != 1 {
		t.Errorf("requests %d rejected %d events %d", eb.Requests(), eb.Rejected(), len(eb.Events()))
	}
}

func TestEventBridgeStallNextTimesOutThenSucceeds(t *testing.T) {
	eb := NewEventBridge(Options{})
	defer eb.Close()
	c := ebClient(t, eb, func(o *eventbridge.Options) { o.HTTPClient = &http.Client{Timeout: 200 * time.Millisecond} })
	eb.StallNext(1, 10*time.Second)
	if _, err := c.PutEvents(context.Background(), &eventbridge.PutEventsInput{Entries: []ebtypes.PutEventsRequestEntry{ebEntry("s", `{}`)}}); err != nil {
		t.Fatal(err)
	}
	if eb.Requests() != 2 || eb.Calls("PutEvents") != 2 || len(eb.Events()) != 1 {
		t.Errorf("requests %d calls %d events %d", eb.Requests(), eb.Calls("PutEvents"), len(eb.Events()))
	}
}
