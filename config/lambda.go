package config

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// Limits and defaults of the lambda sink (the sinks/lambda package
// documents the sources of the payload limits).
const (
	// LambdaMaxSyncPayload is the Invoke payload limit of a synchronous
	// (RequestResponse) invocation: 6 MiB.
	LambdaMaxSyncPayload = 6 << 20
	// LambdaMaxAsyncPayload is the Invoke payload limit of an asynchronous
	// (Event) invocation: 1 MiB (raised from 256 KB in October 2025).
	LambdaMaxAsyncPayload = 1 << 20
	// DefaultLambdaSyncTimeout is the timeout of a RequestResponse sink
	// when none is set: the function runs within it.
	DefaultLambdaSyncTimeout = time.Minute
	// lambdaMaxClientContext is the limit on the base64-encoded client
	// context (InvokeInput.ClientContext: "Up to 3,583 bytes").
	lambdaMaxClientContext = 3583
	// lambdaMaxFunctionLen and lambdaMaxNameLen are Invoke's limits on
	// FunctionName: 170 characters, 64 for a name alone.
	lambdaMaxFunctionLen = 170
	lambdaMaxNameLen     = 64
)

var (
	// lambdaFunctionRE is the FunctionName pattern of the Lambda API
	// reference for Invoke (NamespacedFunctionName): a name, a partial ARN
	// (account:function:name) or a full ARN, each optionally followed by
	// ":version" or ":alias".
	lambdaFunctionRE = regexp.MustCompile(`^(arn:(aws[a-zA-Z-]*)?:lambda:)?([a-z]{2}((-gov)|(-iso[a-z]?))?-[a-z]+-\d{1}:)?(\d{12}:)?(function:)?([a-zA-Z0-9-_\.]+)(:(\$LATEST(\.PUBLISHED)?|[a-zA-Z0-9-_]+))?$`)
	// lambdaQualifierRE is a version number, $LATEST or an alias name.
	lambdaQualifierRE = regexp.MustCompile(`^(\$LATEST(\.PUBLISHED)?|[a-zA-Z0-9$_-]{1,128})$`)
	// awsServiceRE is a SigV4 signing name ("lambda", "execute-api").
	awsServiceRE = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)
)

var lambdaInvocationTypes = []string{LambdaInvocationEvent, LambdaInvocationRequestResponse}

// checkLambdaFunction returns what is wrong with an Invoke FunctionName, or
// "", and the qualifier it carries ("name:alias", "arn:...:function:f:3").
func checkLambdaFunction(f string) (msg, qualifier string) {
	const forms = `use a function name ("step1"), name:alias ("step1:live"), ARN ("arn:aws:lambda:us-east-1:123456789012:function:step1") or partial ARN ("123456789012:function:step1")`
	switch {
	case f == "":
		return "must not be empty: " + forms, ""
	case len(f) > lambdaMaxFunctionLen:
		return fmt.Sprintf("is %d characters, Lambda accepts at most %d", len(f), lambdaMaxFunctionLen), ""
	case !lambdaFunctionRE.MatchString(f):
		return fmt.Sprintf("invalid function %q: %s", f, forms), ""
	}
	parts := strings.Split(f, ":")
	if i := indexOf(parts, "function"); i >= 0 {
		parts = parts[i+1:]
	} else if len(parts) > 2 {
		// Something the pattern accepts without "function:" (an ARN
		// without its resource type, "us-east-1:step1"): not an ARN
		// Lambda resolves.
		return fmt.Sprintf("invalid function %q: %s", f, forms), ""
	}
	if len(parts) == 1 && len(parts[0]) > lambdaMaxNameLen && !strings.Contains(f, ":") {
		return fmt.Sprintf("function name is %d characters, Lambda accepts at most %d", len(parts[0]), lambdaMaxNameLen), ""
	}
	if len(parts) > 1 {
		qualifier = parts[1]
	}
	return "", qualifier
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

func decodeLambda(d *decoder, o *obj, s *Sink) {
	l := &LambdaSink{}
	s.Lambda = l
	l.InvocationType = o.enum("invocation_type", LambdaInvocationEvent, lambdaInvocationTypes)
	var fnQualifier string
	if f, ok := o.reqString("function"); ok {
		var msg string
		if msg, fnQualifier = checkLambdaFunction(f); msg != "" {
			d.errorf(o.keyPath("function"), o.lineOf("function"), "%s", msg)
		}
		l.Function = f
	}
	if q, v, ok := o.str("qualifier"); ok {
		switch {
		case !lambdaQualifierRE.MatchString(q):
			d.errorf(o.keyPath("qualifier"), v.line, `invalid qualifier %q: use a version number, "$LATEST" or an alias name (letters, digits, "-" and "_", at most 128)`, q)
		case fnQualifier != "" && fnQualifier != q:
			d.errorf(o.keyPath("qualifier"), v.line, "%q differs from the qualifier %q in function (line %d): set it once", q, fnQualifier, o.lineOf("function"))
		}
		l.Qualifier = q
	}
	if c, v, ok := o.str("client_context"); ok {
		var obj map[string]json.RawMessage
		switch {
		case json.Unmarshal([]byte(c), &obj) != nil || obj == nil:
			d.errorf(o.keyPath("client_context"), v.line, `must be a JSON object, like '{"custom": {"source": "changegate"}}'`)
		case base64.StdEncoding.EncodedLen(len(c)) > lambdaMaxClientContext:
			d.errorf(o.keyPath("client_context"), v.line, "is %d bytes once base64-encoded, Lambda accepts at most %d", base64.StdEncoding.EncodedLen(len(c)), lambdaMaxClientContext)
		}
		l.ClientContext = c
	}
	limit := int64(LambdaMaxAsyncPayload)
	if l.InvocationType == LambdaInvocationRequestResponse {
		limit = LambdaMaxSyncPayload
	}
	timeoutSet := o.t.get("timeout") != nil
	l.AWS = d.aws(o, limit, limit)
	if !timeoutSet && l.InvocationType == LambdaInvocationRequestResponse {
		l.Timeout = DefaultLambdaSyncTimeout
	}
}

// lambdaURLRegion returns the region in the host of a Lambda function URL
// (<id>.lambda-url.<region>.on.aws) or an API Gateway endpoint
// (<id>.execute-api.<region>.amazonaws.com[.cn]), or "".
func lambdaURLRegion(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	labels := strings.Split(strings.ToLower(u.Hostname()), ".")
	for i := 1; i+1 < len(labels); i++ {
		switch {
		case labels[i] == "lambda-url" && strings.Join(labels[i+2:], ".") == "on.aws",
			labels[i] == "execute-api" && strings.HasPrefix(strings.Join(labels[i+2:], "."), "amazonaws.com"):
			if regionRE.MatchString(labels[i+1]) {
				return labels[i+1]
			}
		}
	}
	return ""
}

// webhookAuth decodes the AWS SigV4 options of a webhook sink: auth,
// aws_service, region and role_arn.
func (d *decoder) webhookAuth(o *obj, w *WebhookSink) {
	w.Auth = o.enum("auth", "", []string{WebhookAuthSigV4})
	sigv4 := w.Auth == WebhookAuthSigV4
	for _, k := range []string{"aws_service", "region", "role_arn"} {
		if v := o.t.get(k); v != nil && !sigv4 && !o.bad["auth"] {
			d.errorf(o.keyPath(k), v.line, `applies only with auth = %q`, WebhookAuthSigV4)
		}
	}
	if s, v, ok := o.str("aws_service"); ok {
		if !awsServiceRE.MatchString(s) {
			d.errorf(o.keyPath("aws_service"), v.line, `invalid service %q: use a SigV4 signing name like "lambda" or "execute-api"`, s)
		}
		w.AWSService = s
	}
	if r, v, ok := o.str("region"); ok {
		if !regionRE.MatchString(r) {
			d.errorf(o.keyPath("region"), v.line, `invalid region %q: use a region code like "us-east-1"`, r)
		}
		w.Region = r
	}
	if r, v, ok := o.str("role_arn"); ok {
		if !roleARNRE.MatchString(r) {
			d.errorf(o.keyPath("role_arn"), v.line, `must be an IAM role ARN like "arn:aws:iam::123456789012:role/changegate", got %q`, r)
		}
		w.RoleARN = r
	}
	if !sigv4 {
		return
	}
	if w.AWSService == "" {
		w.AWSService = "lambda"
	}
	if w.Region == "" && o.t.get("region") == nil && w.URL != "" {
		if w.Region = lambdaURLRegion(w.URL); w.Region == "" {
			d.errorf(o.keyPath("region"), o.lineOf("auth"), `required with auth = %q: the url is not a function URL (*.lambda-url.<region>.on.aws) or execute-api host to take the region from`, WebhookAuthSigV4)
		}
	}
	if w.URL != "" && w.AWSService != "s3" {
		if msg := SigV4PathProblem(w.URL); msg != "" {
			d.errorf(o.keyPath("url"), o.lineOf("url"), `%s: with auth = %q (line %d) AWS normalizes the path before it checks the signature (every service but s3), so the request would be refused; write the path in normal form`, msg, WebhookAuthSigV4, o.lineOf("auth"))
		}
	}
	for _, k := range []string{"bearer_token", "basic_auth"} {
		if v := o.t.get(k); v != nil {
			d.errorf(o.keyPath(k), v.line, `cannot be combined with auth = %q (line %d): SigV4 sets the Authorization header`, WebhookAuthSigV4, o.lineOf("auth"))
		}
	}
	for _, h := range w.Headers {
		if h.Name == "Authorization" || strings.HasPrefix(h.Name, "X-Amz-") {
			d.errorf(o.keyPath("headers"), o.lineOf("headers"), `header %s cannot be set with auth = %q (line %d): SigV4 sets it`, h.Name, WebhookAuthSigV4, o.lineOf("auth"))
		}
	}
}

// SigV4PathProblem says what keeps rawURL's path from being signed with
// SigV4 as it is sent, or "" when nothing does. AWS services other than S3
// normalize the path before they compute the canonical request (RFC 3986
// dot-segment removal, and empty segments collapsed, as botocore's
// remove_dot_segments does), while the signer (aws-sdk-go-v2's v4.Signer)
// and net/http keep it as written: a path with a "." or ".." segment or an
// empty segment ("//") would be signed differently from what the service
// checks. Such URLs are refused rather than rewritten, so the request goes
// out exactly as configured. A trailing slash is kept by both sides and is
// fine. The message never quotes the path (it may hold a secret).
func SigV4PathProblem(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	p := u.EscapedPath()
	if p == "" || p == "/" {
		return ""
	}
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, seg := range segs {
		dec, err := url.PathUnescape(seg)
		if err != nil {
			dec = seg
		}
		switch {
		case dec == "." || dec == "..":
			return `the path has a "` + dec + `" segment`
		case seg == "" && i < len(segs)-1:
			return `the path has an empty segment ("//")`
		}
	}
	return ""
}
