package awstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

func sqsClient(t *testing.T, s *SQS, optFns ...func(*sqs.Options)) *sqs.Client {
	t.Helper()
	return sqs.NewFromConfig(clientConfig(s, 3), optFns...)
}

func strAttr(v string) sqstypes.MessageAttributeValue {
	return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

func TestMD5OfMessageAttributesVectors(t *testing.T) {
	// Digests pinned by moto's SQS tests as what AWS returns.
	num := func(v string) MessageAttribute { return MessageAttribute{DataType: "Number", StringValue: v} }
	for _, c := range []struct {
		attrs map[string]MessageAttribute
		want  string
	}{
		{map[string]MessageAttribute{"timestamp": num("1493147359900")}, "235c5c510d26fb653d073faed50ae77c"},
		{map[string]MessageAttribute{"timestamp": num("1493147359901")}, "994258b45346a2cc3f9cbb611aa7af30"},
		{map[string]MessageAttribute{"SOME_Valid.attribute-Name": num("1493147359900")}, "36655e7e9d7c0e8479fa3f3f42247ae7"},
		{map[string]MessageAttribute{
			"ccc":             {DataType: "String", StringValue: "testjunk"},
			"aaa":             {DataType: "Binary", BinaryValue: []byte{2, 3, 4}},
			"zzz":             num("0230.01"),
			"öther_encodings": {DataType: "String", StringValue: "T\u00fcst"},
		}, "8ae21a7957029ef04146b42aeaa18a22"},
	} {
		if got := MD5OfMessageAttributes(c.attrs); got != c.want {
			t.Errorf("%v: got %s want %s", c.attrs, got, c.want)
		}
	}
	if MD5OfMessageAttributes(nil) != "" {
		t.Error("no attributes should have no digest")
	}
}

func TestSQSGetQueueURL(t *testing.T) {
	s := NewSQS(Options{})
	defer s.Close()
	url := s.CreateQueue("orders")
	if url != s.URL()+"/"+DefaultAccountID+"/orders" {
		t.Fatalf("url = %s", url)
	}
	c := sqsClient(t, s)
	out, err := c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String("orders")})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(out.QueueUrl) != url {
		t.Errorf("QueueUrl = %s", aws.ToString(out.QueueUrl))
	}
	_, err = c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String("nope")})
	var qdne *sqstypes.QueueDoesNotExist
	if !errors.As(err, &qdne) || apiCode(err) != "AWS.SimpleQueueService.NonExistentQueue" {
		t.Errorf("unknown queue: %T %v", err, err)
	}
	_, err = c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{
		QueueUrl: aws.String(s.QueueURL("nope")),
		Entries:  []sqstypes.SendMessageBatchRequestEntry{{Id: aws.String("a"), MessageBody: aws.String("x")}},
	})
	if !errors.As(err, &qdne) {
		t.Errorf("send to unknown queue: %v", err)
	}
	if s.Requests() != 3 || s.Calls("GetQueueUrl") != 2 || s.Calls("SendMessageBatch") != 1 {
		t.Errorf("requests = %d, calls %d/%d (client errors are not retried)", s.Requests(), s.Calls("GetQueueUrl"), s.Calls("SendMessageBatch"))
	}
}

func TestSQSSendMessageBatchStandard(t *testing.T) {
	s := NewSQS(Options{})
	defer s.Close()
	url := s.CreateQueue("events")
	c := sqsClient(t, s) // the SDK validates MD5OfMessageBody by default
	out, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{
		QueueUrl: aws.String(url),
		Entries: []sqstypes.SendMessageBatchRequestEntry{
			{
				Id:          aws.String("e1"),
				MessageBody: aws.String(`{"id":"e1","ünï":"cödé 😀"}`),
				MessageAttributes: map[string]sqstypes.MessageAttributeValue{
					"source":        strAttr("shop"),
					"operationType": strAttr("insert"),
					"seq":           {DataType: aws.String("Number"), StringValue: aws.String("42")},
					"raw":           {DataType: aws.String("Binary"), BinaryValue: []byte{0, 1, 2, 255}},
				},
				MessageSystemAttributes: map[string]sqstypes.MessageSystemAttributeValue{
					"AWSTraceHeader": {DataType: aws.String("String"), StringValue: aws.String("Root=1-5759e988-bd862e3fe1be46a994272793")},
				},
			},
			{Id: aws.String("e2"), MessageBody: aws.String("plain"), DelaySeconds: 5},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Successful) != 2 || len(out.Failed) != 0 {
		t.Fatalf("out = %+v", out)
	}
	msgs := s.Messages("events")
	if len(msgs) != 2 {
		t.Fatalf("messages = %+v", msgs)
	}
	m := msgs[0]
	r := out.Successful[0]
	if aws.ToString(r.Id) != "e1" || aws.ToString(r.MessageId) != m.MessageID || m.MessageID == "" {
		t.Errorf("result %+v vs message %+v", r, m)
	}
	if aws.ToString(r.MD5OfMessageAttributes) != MD5OfMessageAttributes(m.Attributes) || aws.ToString(r.MD5OfMessageAttributes) == "" {
		t.Errorf("MD5OfMessageAttributes = %s", aws.ToString(r.MD5OfMessageAttributes))
	}
	if r.MD5OfMessageSystemAttributes == nil || r.SequenceNumber != nil {
		t.Errorf("system md5 %v seq %v", r.MD5OfMessageSystemAttributes, r.SequenceNumber)
	}
	if m.Attributes["source"].StringValue != "shop" || m.Attributes["seq"].DataType != "Number" ||
		!bytes.Equal(m.Attributes["raw"].BinaryValue, []byte{0, 1, 2, 255}) || m.Body != `{"id":"e1","ünï":"cödé 😀"}` {
		t.Errorf("message = %+v", m)
	}
	if m.SystemAttributes["AWSTraceHeader"].StringValue == "" {
		t.Errorf("system attributes = %+v", m.SystemAttributes)
	}
	if msgs[1].DelaySeconds != 5 || msgs[1].Attributes != nil || out.Successful[1].MD5OfMessageAttributes != nil {
		t.Errorf("second = %+v / %+v", msgs[1], out.Successful[1])
	}
}

func TestSQSFIFOAndDeduplication(t *testing.T) {
	s := NewSQS(Options{})
	defer s.Close()
	url := s.CreateQueueWith("orders.fifo", QueueOptions{DeduplicationWindow: 300 * time.Millisecond})
	c := sqsClient(t, s)
	send := func(entries ...sqstypes.SendMessageBatchRequestEntry) *sqs.SendMessageBatchOutput {
		t.Helper()
		out, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	entry := func(id, group, dedup, body string) sqstypes.SendMessageBatchRequestEntry {
		return sqstypes.SendMessageBatchRequestEntry{
			Id: aws.String(id), MessageBody: aws.String(body),
			MessageGroupId: aws.String(group), MessageDeduplicationId: aws.String(dedup),
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{"db": strAttr("shop")},
		}
	}

	out := send(entry("a", "doc1", "ev1", "one"), entry("b", "doc1", "ev2", "two"), entry("c", "doc2", "ev3", "three"))
	if len(out.Successful) != 3 {
		t.Fatalf("out = %+v", out)
	}
	first := out.Successful[0]
	if first.SequenceNumber == nil || len(*first.SequenceNumber) != 20 ||
		aws.ToString(out.Successful[1].SequenceNumber) <= aws.ToString(first.SequenceNumber) {
		t.Errorf("sequence numbers %v %v", aws.ToString(first.SequenceNumber), aws.ToString(out.Successful[1].SequenceNumber))
	}

	// A re-delivery after a crash: same dedup ids → acknowledged, not stored.
	out = send(entry("a", "doc1", "ev1", "one"), entry("b", "doc1", "ev2", "two"), entry("d", "doc1", "ev4", "four"))
	if len(out.Successful) != 3 || len(out.Failed) != 0 {
		t.Fatalf("resend = %+v", out)
	}
	if aws.ToString(out.Successful[0].MessageId) != aws.ToString(first.MessageId) {
		t.Errorf("duplicate got a new message id")
	}
	msgs := s.Messages("orders.fifo")
	var bodies []string
	for _, m := range msgs {
		bodies = append(bodies, m.Body+"/"+m.GroupID+"/"+m.DeduplicationID)
	}
	if got := strings.Join(bodies, ","); got != "one/doc1/ev1,two/doc1/ev2,three/doc2/ev3,four/doc1/ev4" {
		t.Errorf("stored = %s", got)
	}
	if s.Duplicates("orders.fifo") != 2 {
		t.Errorf("duplicates = %d", s.Duplicates("orders.fifo"))
	}

	// After the window the id is forgotten.
	time.Sleep(350 * time.Millisecond)
	send(entry("a", "doc1", "ev1", "one"))
	if n := len(s.Messages("orders.fifo")); n != 5 {
		t.Errorf("after window: %d messages", n)
	}

	// Missing group id / dedup id are per-entry sender faults.
	out = send(
		sqstypes.SendMessageBatchRequestEntry{Id: aws.String("nogroup"), MessageBody: aws.String("x"), MessageDeduplicationId: aws.String("z1")},
		sqstypes.SendMessageBatchRequestEntry{Id: aws.String("nodedup"), MessageBody: aws.String("x"), MessageGroupId: aws.String("g")},
		entry("ok", "g", "z2", "fine"),
	)
	if len(out.Successful) != 1 || len(out.Failed) != 2 {
		t.Fatalf("out = %+v", out)
	}
	for _, f := range out.Failed {
		want := map[string]string{"nogroup": "MissingParameter", "nodedup": "InvalidParameterValue"}[aws.ToString(f.Id)]
		if aws.ToString(f.Code) != want || !f.SenderFault || aws.ToString(f.Message) == "" {
			t.Errorf("failed entry %s: %s %v %s", aws.ToString(f.Id), aws.ToString(f.Code), f.SenderFault, aws.ToString(f.Message))
		}
	}

	// Content-based deduplication.
	cb := s.CreateQueueWith("cb.fifo", QueueOptions{ContentBasedDeduplication: true})
	for range 2 {
		_, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(cb), Entries: []sqstypes.SendMessageBatchRequestEntry{
			{Id: aws.String("x"), MessageBody: aws.String("same"), MessageGroupId: aws.String("g")},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := s.Messages("cb.fifo"); len(m) != 1 || m[0].DeduplicationID != ContentDeduplicationID("same") || s.Duplicates("cb.fifo") != 1 {
		t.Errorf("content dedup: %+v dups %d", m, s.Duplicates("cb.fifo"))
	}
}

func TestSQSWrongSecretRejected(t *testing.T) {
	s := NewSQS(Options{})
	defer s.Close()
	url := s.CreateQueue("q")
	c := sqsClient(t, s, func(o *sqs.Options) {
		o.Credentials = credentials.NewStaticCredentialsProvider(AccessKeyID, SecretAccessKey+"x", "")
	})
	_, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(url),
		Entries: []sqstypes.SendMessageBatchRequestEntry{{Id: aws.String("a"), MessageBody: aws.String("x")}}})
	if err == nil || apiCode(err) != "SignatureDoesNotMatch" {
		t.Fatalf("err = %v", err)
	}
	if s.Rejected() != 1 || s.Requests() != 1 || len(s.Messages("q")) != 0 {
		t.Errorf("rejected %d requests %d", s.Rejected(), s.Requests())
	}
	c = sqsClient(t, s, func(o *sqs.Options) {
		o.Credentials = credentials.NewStaticCredentialsProvider("AKIDOTHER", SecretAccessKey, "")
	})
	_, err = c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String("q")})
	if apiCode(err) != "InvalidClientTokenId" {
		t.Errorf("unknown key: %v", err)
	}
	// The signing name must be "sqs": a signature scoped to "events" fails.
	req := signedRequestFor(t, s.URL(), SecretAccessKey, "events", "AmazonSQS.GetQueueUrl", "application/x-amz-json-1.0", time.Now(), `{"QueueName":"q"}`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("X-Amzn-Query-Error") != "SignatureDoesNotMatch;Sender" || !strings.Contains(string(b), "correct service") {
		t.Errorf("events-scoped signature: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	// The same request scoped to "sqs" passes.
	req = signedRequestFor(t, s.URL(), SecretAccessKey, "sqs", "AmazonSQS.GetQueueUrl", "application/x-amz-json-1.0", time.Now(), `{"QueueName":"q"}`)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("sqs-scoped signature: %d", resp.StatusCode)
	}
}

func TestSQSThrottleAndStatus(t *testing.T) {
	s := NewSQS(Options{})
	defer s.Close()
	url := s.CreateQueue("q")
	c := sqsClient(t, s)
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(url),
		Entries: []sqstypes.SendMessageBatchRequestEntry{{Id: aws.String("a"), MessageBody: aws.String("x")}}}

	s.Throttle(2)
	if _, err := c.SendMessageBatch(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	if s.Requests() != 3 || len(s.Messages("q")) != 1 {
		t.Errorf("requests %d messages %d", s.Requests(), len(s.Messages("q")))
	}

	s.Throttle(1)
	_, err := c.SendMessageBatch(context.Background(), in, func(o *sqs.Options) { o.Retryer = aws.NopRetryer{} })
	var rt *sqstypes.RequestThrottled
	if !errors.As(err, &rt) || !retry.IsErrorThrottles(retry.DefaultThrottles).IsErrorThrottle(err).Bool() ||
		!retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err).Bool() {
		t.Errorf("throttle: %T %v", err, err)
	}

	s.FailStatus(1, 500)
	if _, err := c.SendMessageBatch(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	s.FailStatus(1, 503)
	_, err = c.SendMessageBatch(context.Background(), in, func(o *sqs.Options) { o.Retryer = aws.NopRetryer{} })
	var re interface{ HTTPStatusCode() int }
	if !errors.As(err, &re) || re.HTTPStatusCode() != 503 || apiCode(err) != "ServiceUnavailable" ||
		!retry.IsErrorRetryables(retry.DefaultRetryables).IsErrorRetryable(err).Bool() {
		t.Errorf("503: %v", err)
	}
	s.Reset()
	if s.Requests() != 0 || len(s.Messages("q")) != 0 {
		t.Error("reset")
	}
}

func TestSQSPartialFailure(t *testing.T) {
	s := NewSQS(Options{})
	defer s.Close()
	url := s.CreateQueue("q")
	c := sqsClient(t, s)
	s.FailEntries(func(m Message) (string, string, bool) {
		switch m.Body {
		case "transient":
			return "InternalError", "We encountered an internal error. Please try again.", false
		case "permanent":
			return "KMS.AccessDeniedException", "denied", true
		}
		return "", "", false
	})
	out, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(url),
		Entries: []sqstypes.SendMessageBatchRequestEntry{
			{Id: aws.String("a"), MessageBody: aws.String("fine")},
			{Id: aws.String("b"), MessageBody: aws.String("transient")},
			{Id: aws.String("c"), MessageBody: aws.String("permanent")},
			{Id: aws.String("d"), MessageBody: aws.String("bad\x01char")},
			{Id: aws.String("e"), MessageBody: aws.String("x"), MessageAttributes: map[string]sqstypes.MessageAttributeValue{
				"n": {DataType: aws.String("Number"), StringValue: aws.String("not a number")}}},
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Successful) != 1 || aws.ToString(out.Successful[0].Id) != "a" || len(out.Failed) != 4 {
		t.Fatalf("out = %+v", out)
	}
	want := map[string]struct {
		code   string
		sender bool
	}{
		"b": {"InternalError", false}, "c": {"KMS.AccessDeniedException", true},
		"d": {"InvalidMessageContents", true}, "e": {"InvalidParameterValue", true},
	}
	for _, f := range out.Failed {
		w := want[aws.ToString(f.Id)]
		if aws.ToString(f.Code) != w.code || f.SenderFault != w.sender {
			t.Errorf("%s: %s %v", aws.ToString(f.Id), aws.ToString(f.Code), f.SenderFault)
		}
	}
	if len(s.Messages("q")) != 1 {
		t.Errorf("stored %d", len(s.Messages("q")))
	}
}

func TestSQSBatchLimits(t *testing.T) {
	s := NewSQS(Options{MaxRequestSize: 256 * 1024})
	defer s.Close()
	url := s.CreateQueue("q")
	c := sqsClient(t, s)
	send := func(entries []sqstypes.SendMessageBatchRequestEntry) error {
		_, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
		return err
	}
	var eleven []sqstypes.SendMessageBatchRequestEntry
	for i := range 11 {
		eleven = append(eleven, sqstypes.SendMessageBatchRequestEntry{Id: aws.String(fmt.Sprint("m", i)), MessageBody: aws.String("x")})
	}
	var tooMany *sqstypes.TooManyEntriesInBatchRequest
	if err := send(eleven); !errors.As(err, &tooMany) || apiCode(err) != "AWS.SimpleQueueService.TooManyEntriesInBatchRequest" {
		t.Errorf("11 entries: %v", err)
	}
	var notDistinct *sqstypes.BatchEntryIdsNotDistinct
	if err := send([]sqstypes.SendMessageBatchRequestEntry{eleven[0], eleven[0]}); !errors.As(err, &notDistinct) {
		t.Errorf("repeated ids: %v", err)
	}
	var badID *sqstypes.InvalidBatchEntryId
	if err := send([]sqstypes.SendMessageBatchRequestEntry{{Id: aws.String("a b"), MessageBody: aws.String("x")}}); !errors.As(err, &badID) {
		t.Errorf("bad id: %v", err)
	}

	// Two messages summing to exactly the limit pass; one byte more fails.
	half := 128 * 1024
	pair := func(extra int) []sqstypes.SendMessageBatchRequestEntry {
		return []sqstypes.SendMessageBatchRequestEntry{
			{Id: aws.String("a"), MessageBody: aws.String(strings.Repeat("a", half-len("k")-len("String")-len("v"))),
				MessageAttributes: map[string]sqstypes.MessageAttributeValue{"k": strAttr("v")}},
			{Id: aws.String("b"), MessageBody: aws.String(strings.Repeat("b", half+extra))},
		}
	}
	if err := send(pair(0)); err != nil {
		t.Errorf("at limit: %v", err)
	}
	var tooLong *sqstypes.BatchRequestTooLong
	if err := send(pair(1)); !errors.As(err, &tooLong) || apiCode(err) != "AWS.SimpleQueueService.BatchRequestTooLong" {
		t.Errorf("over limit: %v", err)
	}
	if s.Requests() != 5 {
		t.Errorf("requests = %d", s.Requests())
	}

	// Per-queue MaximumMessageSize fails just that entry.
	small := s.CreateQueueWith("small", QueueOptions{MaximumMessageSize: 1024})
	out, err := c.SendMessageBatch(context.Background(), &sqs.SendMessageBatchInput{QueueUrl: aws.String(small), Entries: []sqstypes.SendMessageBatchRequestEntry{
		{Id: aws.String("big"), MessageBody: aws.String(strings.Repeat("x", 1025))},
		{Id: aws.String("ok"), MessageBody: aws.String(strings.Repeat("x", 1024))},
	}})
	if err != nil || len(out.Failed) != 1 || aws.ToString(out.Failed[0].Id) != "big" || !out.Failed[0].SenderFault {
		t.Errorf("max message size: %v %+v", err, out)
	}
}

func TestSQSClockSkewCorrectedBySDK(t *testing.T) {
	s := NewSQS(Options{Now: func() time.Time { return time.Now().Add(-10 * time.Minute) }})
	defer s.Close()
	s.CreateQueue("q")
	c := sqsClient(t, s)
	if _, err := c.GetQueueUrl(context.Background(), &sqs.GetQueueUrlInput{QueueName: aws.String("q")}); err != nil {
		t.Fatal(err)
	}
	if s.Requests() != 2 || s.Rejected() != 1 {
		t.Errorf("requests %d rejected %d", s.Requests(), s.Rejected())
	}
}
