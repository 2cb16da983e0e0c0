#!/bin/sh
# Makes the certificates of the TLS probe tests in directory $1 (created),
# with the openssl CLI: a lab CA and, signed by it unless said otherwise,
# server certificates for the name good.test (and 127.0.0.1):
#   ca.pem                the lab CA (ca_file)
#   good.{pem,key}        valid for good.test and IP 127.0.0.1
#   other.{pem,key}       valid, but for other.test only (wrong name)
#   expired.{pem,key}     good.test, valid 2020-01-01 to 2021-01-01
#   future.{pem,key}      good.test, valid from 2090-01-01
#   stranger.{pem,key}    good.test, signed by another CA (unknown issuer)
#   client.{pem,key}      good.test, but for client authentication only
# EC P-256 keys: quick to make, and what TLS servers commonly use.
set -eu
out=$1
mkdir -p "$out"
cd "$out"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

ca() { # name
    key "$1"
    openssl req -x509 -new -key "$1.key" -subj "/CN=xlb test $1" -days 3650 \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$1.pem"
}

# openssl ca, for the dates that x509 -days cannot give (past, future).
cat > ca.cnf <<'CNF'
[ca]
default_ca = local
[local]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = any
copy_extensions = copy
unique_subject = no
[any]
commonName = supplied
CNF
: > index.txt
echo 1000 > serial

leaf() { # name, issuing CA, SAN, start, end[, extended key usage]
    key "$1"
    openssl req -new -key "$1.key" -subj "/CN=$1" -addext "subjectAltName=$3" \
        -addext "basicConstraints=CA:FALSE" -addext "extendedKeyUsage=${6:-serverAuth}" \
        -out "$1.csr"
    openssl ca -batch -notext -config ca.cnf -cert "$2.pem" -keyfile "$2.key" \
        -in "$1.csr" -out "$1.pem" -startdate "$4" -enddate "$5" 2>/dev/null
}

ca ca
ca stranger-ca
now=20200101000000Z
far=20891231000000Z
leaf good ca "DNS:good.test,IP:127.0.0.1" $now $far
leaf other ca "DNS:other.test" $now $far
leaf expired ca "DNS:good.test,IP:127.0.0.1" 20200101000000Z 20210101000000Z
leaf future ca "DNS:good.test,IP:127.0.0.1" 20900101000000Z 20910101000000Z
leaf stranger stranger-ca "DNS:good.test,IP:127.0.0.1" $now $far
leaf client ca "DNS:good.test,IP:127.0.0.1" $now $far clientAuth
