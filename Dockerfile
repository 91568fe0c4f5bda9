# contextforge-router image: the gateway (`serve`), the endpoint picker (`epp`) and the mock
# engine, one binary. Multi-stage: the build stage compiles TypeScript with the dev
# dependencies; the runtime stage installs production dependencies only and runs as the
# unprivileged `node` user of the official image (uid and gid 1000).
ARG NODE_IMAGE=node:20-bookworm-slim

FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

FROM ${NODE_IMAGE} AS runtime
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY proto ./proto
COPY README.md ./
# the `node` user and group of the official image, by number so runAsNonRoot can check it
USER 1000:1000
# 8080: OpenAI gateway (serve); 9002: ext_proc gRPC (epp); 9090: metrics, health and admin (epp)
EXPOSE 8080 9002 9090
ENTRYPOINT ["node", "/app/dist/cli/main.js"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
