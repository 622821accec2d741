package awstest

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	ltypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"
)

func lambdaClient(l *Lambda) *lambda.Client {
	return lambda.NewFromConfig(clientConfig(l, 1))
}

func TestLambdaInvokeRoundTrip(t *testing.T) {
	l := NewLambda(Options{})
	defer l.Close()
	l.AddFunction("step1", func(inv Invocation) Result {
		if bytes.Contains(inv.Payload, []byte("boom")) {
			return Result{Payload: []byte(`{"errorMessage":"boom","errorType":"Error"}`), FunctionError: "Unhandled"}
		}
		return Result{Payload: append([]byte(`{"echo":`), append(inv.Payload, '}')...)}
	}, map[string]string{"live": "7"})
	c := lambdaClient(l)
	ctx := context.Background()

	out, err := c.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("step1"), InvocationType: ltypes.InvocationTypeEvent, Payload: []byte(`{"a":1}`)})
	if err != nil || out.StatusCode != http.StatusAccepted || len(out.Payload) != 0 {
		t.Fatalf("event: %+v, %v", out, err)
	}
	cc := base64.StdEncoding.EncodeToString([]byte(`{"custom":{"k":"v"}}`))
	// A full ARN with an alias: ':' is escaped in the path and the
	// signature covers it.
	out, err = c.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(l.ARN("step1") + ":live"), Payload: []byte(`{"a":2}`), ClientContext: aws.String(cc)})
	if err != nil || out.StatusCode != http.StatusOK || string(out.Payload) != `{"echo":{"a":2}}` || aws.ToString(out.ExecutedVersion) != "7" || out.FunctionError != nil {
		t.Fatalf("sync: %+v, %v", out, err)
	}
	out, err = c.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String("step1"), Qualifier: aws.String("3"), Payload: []byte(`"boom"`)})
	if err != nil || aws.ToString(out.FunctionError) != "Unhandled" || !strings.Contains(string(out.Payload), "boom") || aws.ToString(out.ExecutedVersion) != "3" {
		t.Fatalf("function error: %+v, %v", out, err)
	}
	invs := l.Invocations()
	if len(invs) != 3 || invs[0].Type != "Event" || invs[1].Qualifier != "live" || invs[1].Function != "step1" ||
		invs[1].ClientContext != `{"custom":{"k":"v"}}` || invs[2].Qualifier != "3" || l.Rejected() != 0 || l.Calls("Invoke") != 3 {
		t.Fatalf("invocations %+v, rejected %d", invs, l.Rejected())
	}
}

func TestLambdaInvokeErrors(t *testing.T) {
	l := NewLambda(Options{MaxRequestSize: 100})
	defer l.Close()
	l.AddFunction("f", nil, nil)
	c := lambdaClient(l)
	ctx := context.Background()
	in := func(name string) *lambda.InvokeInput {
		return &lambda.InvokeInput{FunctionName: aws.String(name), InvocationType: ltypes.InvocationTypeEvent, Payload: []byte(`{}`)}
	}

	_, err := c.Invoke(ctx, in("missing"))
	var nf *ltypes.ResourceNotFoundException
	if !errors.As(err, &nf) || !strings.Contains(nf.ErrorMessage(), "Function not found: arn:aws:lambda:us-east-1:123456789012:function:missing") {
		t.Errorf("not found: %v", err)
	}
	_, err = c.Invoke(ctx, in("f:nope"))
	if !errors.As(err, &nf) {
		t.Errorf("unknown alias: %v", err)
	}

	l.Throttle(1)
	_, err = c.Invoke(ctx, in("f"))
	var tm *ltypes.TooManyRequestsException
	if !errors.As(err, &tm) || aws.ToString(tm.RetryAfterSeconds) != "1" || tm.Reason != ltypes.ThrottleReasonReservedFunctionConcurrentInvocationLimitExceeded {
		t.Errorf("throttle: %v", err)
	}
	l.FailStatus(1, 500)
	_, err = c.Invoke(ctx, in("f"))
	var se *ltypes.ServiceException
	if !errors.As(err, &se) {
		t.Errorf("500: %v", err)
	}

	big := in("f")
	big.Payload = []byte(`"` + strings.Repeat("x", 200) + `"`)
	_, err = c.Invoke(ctx, big)
	if apiCode(err) != "RequestEntityTooLargeException" || !strings.Contains(err.Error(), "too large for the Event invocation type (limit 100 bytes)") {
		t.Errorf("too large: %v", err)
	}
	bad := in("f")
	bad.Payload = []byte(`{not json`)
	_, err = c.Invoke(ctx, bad)
	var ic *ltypes.InvalidRequestContentException
	if !errors.As(err, &ic) {
		t.Errorf("not json: %v", err)
	}
	mismatch := in("f:1")
	mismatch.Qualifier = aws.String("2")
	_, err = c.Invoke(ctx, mismatch)
	var ip *ltypes.InvalidParameterValueException
	if !errors.As(err, &ip) {
		t.Errorf("qualifier mismatch: %v", err)
	}
	if n := len(l.Invocations()); n != 0 {
		t.Errorf("%d invocations stored, want 0", n)
	}

	_, err = lambda.NewFromConfig(wrongSecretConfig(l)).Invoke(ctx, in("f"))
	if apiCode(err) != "InvalidSignatureException" || l.Rejected() != 1 {
		t.Errorf("bad signature: %v (rejected %d)", err, l.Rejected())
	}
}

// TestLambdaAuthErrors pins the answer to each authentication failure:
// the JSON services' codes (jsonAuthError), but 403 for an expired
// signature as for any other bad one.
func TestLambdaAuthErrors(t *testing.T) {
	for _, c := range []struct {
		kind   authKind
		status int
		typ    string
	}{
		{authMissing, 403, "MissingAuthenticationTokenException"},
		{authIncomplete, 400, "IncompleteSignatureException"},
		{authUnknownKey, 403, "UnrecognizedClientException"},
		{authMismatch, 403, "InvalidSignatureException"},
		{authExpired, 403, "InvalidSignatureException"},
	} {
		e := lambdaService{}.authError(&authError{c.kind, "m"})
		if e.status != c.status || e.typ != c.typ || e.message != "m" {
			t.Errorf("kind %d: %+v, want %d %s", c.kind, e, c.status, c.typ)
		}
	}
}
