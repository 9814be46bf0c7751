# Cirrus image: the operator Deployment runs /usr/local/bin/cirrus-operator from it, and the
# pods the operator creates run `cirrus-trainer ROLE ...` (stage, client, gateway).
#
# The default target is the CPU image. `--target cuda` gives the CUDA image: cirrus-trainer
# built by `make cuda` (--backend cpu|cuda) with the CUDA runtime, cuBLAS and NCCL libraries
# it needs; the GPU driver comes from the host (NVIDIA container toolkit). Builders that skip
# unused stages (BuildKit, buildah) do not build the CUDA stages for the CPU image. (A target
# rather than a build argument naming the stage: buildah 1.28, Debian 12's, cannot resolve a
# stage name that comes from an argument.)

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
COPY tests/nodes/nodes.mk ./tests/nodes/
COPY common ./common
COPY trainer ./trainer
COPY operator ./operator
# A portable x86-64 baseline with AVX2, not the build machine's -march=native.
RUN make MARCH=-march=x86-64-v3 all && make data

# The CUDA build: the toolkit from the pinned PyPI wheels (trainer/scripts/cuda_toolkit.sh),
# then the libraries the binary loads gathered in one folder for the runtime stage.
FROM build AS build-cuda
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3-pip \
    && rm -rf /var/lib/apt/lists/*
COPY tests/cuda ./tests/cuda
RUN CIRRUS_CACHE=/opt/cirrus-cache make MARCH=-march=x86-64-v3 cuda \
    && mkdir -p /opt/cirrus-cuda \
    && cp -L /opt/cirrus-cache/cuda-*/root/nvidia/cu13/lib/libcudart.so.13 \
             /opt/cirrus-cache/cuda-*/root/nvidia/cu13/lib/libcublas.so.13 \
             /opt/cirrus-cache/cuda-*/root/nvidia/cu13/lib/libcublasLt.so.13 \
             /opt/cirrus-cache/cuda-*/root/nvidia/nccl/lib/libnccl.so.2 /opt/cirrus-cuda/

FROM debian:12-slim AS cpu
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

FROM cpu AS cuda
USER root
COPY --from=build-cuda /opt/cirrus-cuda/ /usr/local/lib/cirrus-cuda/
COPY --from=build-cuda /src/build/cuda/bin/cirrus-trainer /usr/local/bin/cirrus-trainer
RUN echo /usr/local/lib/cirrus-cuda > /etc/ld.so.conf.d/cirrus-cuda.conf && ldconfig
USER 65532

# The default: the CPU image.
FROM cpu
