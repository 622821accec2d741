package event

import "time"

// appendRFC3339UTC appends t (whose location must be UTC) as
// t.AppendFormat would with time.RFC3339 (fracDigits 0), rfc3339Milli (3)
// or time.RFC3339Nano (9): the fraction of a second to at most fracDigits
// digits, trailing zeros (and a lone dot) trimmed, then "Z". It is the
// encoder's fast path for the timestamps of every envelope (clusterTime,
// wallTime, $date); a year outside 0..9999 goes through AppendFormat.
func appendRFC3339UTC(dst []byte, t time.Time, fracDigits int) []byte {
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		layout := time.RFC3339Nano
		switch fracDigits {
		case 0:
			layout = time.RFC3339
		case 3:
			layout = rfc3339Milli
		}
		return t.AppendFormat(dst, layout)
	}
	hour, minute, sec := t.Clock()
	dst = append(dst,
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+int(month)/10), byte('0'+int(month)%10), '-',
		byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':',
		byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+sec/10), byte('0'+sec%10))
	if fracDigits > 0 {
		frac := t.Nanosecond()
		for range 9 - fracDigits {
			frac /= 10
		}
		if frac != 0 {
			var buf [9]byte
			n := fracDigits
			for i := n - 1; i >= 0; i-- {
				buf[i] = byte('0' + frac%10)
				frac /= 10
			}
			for n > 0 && buf[n-1] == '0' {
				n--
			}
			dst = append(dst, '.')
			dst = append(dst, buf[:n]...)
		}
	}
	return append(dst, 'Z')
}
