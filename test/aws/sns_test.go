package awstest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"
)

func snsClient(s *SNS, optFns ...func(*sns.Options)) *sns.Client {
	return sns.NewFromConfig(clientConfig(s, 1), optFns...)
}

func snsEntry(id, msg string, attrs map[string]string) snstypes.PublishBatchRequestEntry {
	e := snstypes.PublishBatchRequestEntry{Id: aws.String(id), Message: aws.String(msg)}
	if attrs != nil {
		e.MessageAttributes = map[string]snstypes.MessageAttributeValue{}
		for k, v := range attrs {
			e.MessageAttributes[k] = snstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
	}
	return e
}

// TestSNSPublishBatch runs the real SDK client against the server: the
// form it sends (query protocol, SigV4) is parsed, the XML answer read,
// with per-entry failures and FIFO deduplication.
func TestSNSPublishBatch(t *testing.T) {
	s := NewSNS(Options{})
	defer s.Close()
	arn := s.CreateTopic("changes")
	fifo := s.CreateTopic("changes.fifo")
	c := snsClient(s)
	ctx := context.Background()
	s.FailEntries(func(m SNSMessage) (string, string, bool) {
		if m.Message == "fail" {
			return "InternalError", "try again", false
		}
		return "", "", false
	})
	out, err := c.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: []snstypes.PublishBatchRequestEntry{
		snsEntry("0", `{"a":"é & <b>"}`, map[string]string{"source": "orders", "db": "shop"}),
		snsEntry("1", "fail", nil),
		snsEntry("2", "", nil),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Successful) != 1 || aws.ToString(out.Successful[0].Id) != "0" || aws.ToString(out.Successful[0].MessageId) == "" {
		t.Fatalf("successful %+v", out.Successful)
	}
	if len(out.Failed) != 2 || aws.ToString(out.Failed[0].Code) != "InternalError" || out.Failed[0].SenderFault ||
		aws.ToString(out.Failed[1].Code) != "InvalidParameter" || !out.Failed[1].SenderFault {
		t.Fatalf("failed %+v", out.Failed)
	}
	msgs := s.Messages("changes")
	if len(msgs) != 1 || msgs[0].Message != `{"a":"é & <b>"}` || msgs[0].Attributes["source"].StringValue != "orders" ||
		msgs[0].Attributes["db"].DataType != "String" || len(msgs[0].Attributes) != 2 {
		t.Fatalf("messages %+v", msgs)
	}

	s.FailEntries(nil)
	for range 2 {
		out, err = c.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(fifo), PublishBatchRequestEntries: []snstypes.PublishBatchRequestEntry{
			{Id: aws.String("a"), Message: aws.String("one"), MessageGroupId: aws.String("g"), MessageDeduplicationId: aws.String("d1")},
			{Id: aws.String("b"), Message: aws.String("two"), MessageGroupId: aws.String("g"), MessageDeduplicationId: aws.String("d2")},
			{Id: aws.String("c"), Message: aws.String("three"), MessageDeduplicationId: aws.String("d3")},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if len(out.Successful) != 2 || aws.ToString(out.Successful[1].SequenceNumber) == "" || len(out.Failed) != 1 || aws.ToString(out.Failed[0].Id) != "c" {
			t.Fatalf("fifo: %+v %+v", out.Successful, out.Failed)
		}
	}
	if m := s.Messages("changes.fifo"); len(m) != 2 || m[0].Message != "one" || m[1].GroupID != "g" || s.Duplicates("changes.fifo") != 2 {
		t.Fatalf("fifo messages %+v, %d duplicates", m, s.Duplicates("changes.fifo"))
	}
	if s.Calls("PublishBatch") != 3 || s.Rejected() != 0 {
		t.Errorf("calls %d, rejected %d", s.Calls("PublishBatch"), s.Rejected())
	}
}

// TestSNSErrors checks the error answers as the SDK reports them.
func TestSNSErrors(t *testing.T) {
	s := NewSNS(Options{})
	defer s.Close()
	arn := s.CreateTopicWith("small", TopicOptions{MaximumMessageSize: 100})
	c := snsClient(s)
	ctx := context.Background()
	pub := func(topic string, entries ...snstypes.PublishBatchRequestEntry) error {
		_, err := c.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(topic), PublishBatchRequestEntries: entries})
		return err
	}
	code := func(err error) string {
		var ae smithy.APIError
		if errors.As(err, &ae) {
			return ae.ErrorCode()
		}
		return "<" + err.Error() + ">"
	}
	var notFound *snstypes.NotFoundException
	if err := pub(s.TopicARN("nope"), snsEntry("0", "x", nil)); !errors.As(err, &notFound) {
		t.Errorf("unknown topic: %v", err)
	}
	var throttled *snstypes.ThrottledException
	s.Throttle(1)
	if err := pub(arn, snsEntry("0", "x", nil)); !errors.As(err, &throttled) {
		t.Errorf("throttle: %v", err)
	}
	s.FailStatus(1, 500)
	var internal *snstypes.InternalErrorException
	if err := pub(arn, snsEntry("0", "x", nil)); !errors.As(err, &internal) {
		t.Errorf("500: %v", err)
	}
	s.FailStatus(1, 503)
	if err := pub(arn, snsEntry("0", "x", nil)); code(err) != "ServiceUnavailable" {
		t.Errorf("503: %v", err)
	}
	var tooLong *snstypes.BatchRequestTooLongException
	if err := pub(arn, snsEntry("0", strings.Repeat("x", 60), nil), snsEntry("1", strings.Repeat("x", 60), nil)); !errors.As(err, &tooLong) {
		t.Errorf("too long: %v", err)
	}
	var tooMany *snstypes.TooManyEntriesInBatchRequestException
	many := make([]snstypes.PublishBatchRequestEntry, 11)
	for i := range many {
		many[i] = snsEntry(string(rune('a'+i)), "x", nil)
	}
	if err := pub(arn, many...); !errors.As(err, &tooMany) {
		t.Errorf("11 entries: %v", err)
	}
	var notDistinct *snstypes.BatchEntryIdsNotDistinctException
	if err := pub(arn, snsEntry("0", "x", nil), snsEntry("0", "y", nil)); !errors.As(err, &notDistinct) {
		t.Errorf("same ids: %v", err)
	}
	bad := sns.NewFromConfig(wrongSecretConfig(s))
	if _, err := bad.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(arn), PublishBatchRequestEntries: []snstypes.PublishBatchRequestEntry{snsEntry("0", "x", nil)}}); code(err) != "SignatureDoesNotMatch" || s.Rejected() != 1 {
		t.Errorf("bad signature: %v (rejected %d)", err, s.Rejected())
	}
	if n := len(s.Messages("small")); n != 0 {
		t.Errorf("%d messages stored after failures", n)
	}
}
