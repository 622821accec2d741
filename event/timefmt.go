package event

import (
	"encoding/binary"
	"time"
)

// This file formats the dates and times of an envelope (clusterTime,
// wallTime, $date) as package time would, without going through it for
// the years 1970 to 9999.

// rfc3339Milli is the driver's layout for relaxed $date values.
const rfc3339Milli = "2006-01-02T15:04:05.999Z07:00"

// digitPairs holds the two decimal digits of 0..99, as a little-endian
// 16-bit word each (the first digit in the low byte).
var digitPairs = func() (t [100]uint16) {
	for i := range t {
		t[i] = uint16('0'+i/10) | uint16('0'+i%10)<<8
	}
	return t
}()

// maxDate is the first second of year 10000 (Unix time).
const maxDate = 253402300800

// appendDateSecs appends the UTC date and time of Unix time secs, which
// must be in [0, maxDate), as "YYYY-MM-DDTHH:MM:SS", without going
// through time.Time: the civil date of a day number by Neri and
// Schneider's algorithm ("Euclidean affine functions and their
// application to calendar algorithms", 2022), with no shift needed for
// days from 1970 on (TestDateSecsMatchesTime checks the first and last day
// of every month of years 1970 to 9999 against package time).
func appendDateSecs(dst []byte, secs int64) []byte {
	days, sod := uint32(uint64(secs)/86400), uint32(uint64(secs)%86400)
	n1 := 4*(days+719468) + 3
	c := n1 / 146097
	n2 := n1%146097 | 3
	p2 := uint64(2939745) * uint64(n2)
	ny := uint32(p2) / 2939745 / 4
	y := 100*c + uint32(p2>>32)
	n3 := 2141*ny + 197913
	m, d := n3>>16, (n3&0xFFFF)/2141+1
	if ny >= 306 {
		y++
		m -= 12
	}
	h := sod / 3600
	sod -= h * 3600
	mi := sod / 60
	sec := sod - mi*60
	n := len(dst)
	dst = append(dst, "0000-00-00T00:00:00"...)
	b := dst[n : n+19]
	pair := func(i int, v uint32) { binary.LittleEndian.PutUint16(b[i:], digitPairs[v%100]) }
	pair(0, y/100)
	pair(2, y)
	pair(5, m)
	pair(8, d)
	pair(11, h)
	pair(14, mi)
	pair(17, sec)
	return dst
}

// appendFraction appends "." and the digits decimals of frac (0 < frac <
// 10^digits), zero-padded on the left, without trailing zeros: the
// fraction of a second as AppendFormat writes it with a layout of
// ".999" or ".999999999".
func appendFraction(dst []byte, frac uint64, digits int) []byte {
	for frac%10 == 0 {
		frac /= 10
		digits--
	}
	n := len(dst)
	dst = append(dst, ".000000000"[:digits+1]...)
	for j := n + digits; frac > 0; j, frac = j-1, frac/10 {
		dst[j] = byte('0' + frac%10)
	}
	return dst
}

// appendTimeRFC3339 appends the wall time t as t.AppendFormat with
// time.RFC3339Nano does (appendRFC3339UTC's 9 digits), directly for a
// UTC time of years 1970 to 9999.
func appendTimeRFC3339(dst []byte, t time.Time) []byte {
	if t.Location() != time.UTC {
		return t.AppendFormat(dst, time.RFC3339Nano)
	}
	secs := t.Unix()
	if secs < 0 || secs >= maxDate {
		return appendRFC3339UTC(dst, t, 9)
	}
	dst = appendDateSecs(dst, secs)
	if ns := t.Nanosecond(); ns != 0 {
		dst = appendFraction(dst, uint64(ns), 9)
	}
	return append(dst, 'Z')
}

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
