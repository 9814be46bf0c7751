# Cirrus image: the operator Deployment runs /usr/local/bin/cirrus-operator from it, and the
# pods the operator creates run `cirrus-trainer ROLE ...` (stage, client, gateway).
FROM debian:12-slim AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        gcc make pkg-config libc6-dev libopenblas-openmp-dev zlib1g-dev libxxhash-dev \
        libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev libssl-dev libyaml-dev libzstd-dev \
        bible-kjv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile ./
COPY tests/cluster/cluster.mk ./tests/cluster/
COPY tests/fuzz/fuzz.mk ./tests/fuzz/
COPY common ./common
COPY trainer ./trainer
COPY operator ./operator
# A portable x86-64 baseline with AVX2, not the build machine's -march=native.
RUN make MARCH=-march=x86-64-v3 all && make data

FROM debian:12-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libopenblas0-openmp libgomp1 zlib1g libxxhash0 libmicrohttpd12 libjansson4 libcurl4 \
        libssl3 libzstd1 libyaml-0-2 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 65532 --home /var/lib/cirrus cirrus
COPY --from=build /src/build/bin/ /usr/local/bin/
# The default corpus (the King James Bible) for clients given no --data.
COPY --from=build /src/build/data/kjv.txt /usr/share/cirrus/kjv.txt
ENV CIRRUS_CORPUS=/usr/share/cirrus/kjv.txt
USER 65532
ENTRYPOINT ["/usr/local/bin/cirrus-trainer"]
CMD ["help"]
