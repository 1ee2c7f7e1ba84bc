{{- $fullname := include "floodgate.fullname" . -}}
- serve
- --listen=0.0.0.0:50051
- --http-listen=0.0.0.0:8080
- --config=/etc/floodgate/rules/rules.yaml
- --admin-token-file=/etc/floodgate/admin/tokens
- --http-host={{ $fullname }}-http
- --http-host={{ $fullname }}-http.$(POD_NAMESPACE).svc
{{- range .Values.httpHosts }}
- --http-host={{ . }}
{{- end }}
- --replica-id=$(POD_NAME)
- --max-keys={{ int .Values.maxKeys }}
- --max-key-bytes={{ .Values.maxKeyBytes }}
- --max-unfinished-request-bytes={{ .Values.maxUnfinishedRequestBytes }}
- --shutdown-grace=10s
- --log-format=json
{{- with .Values.redis }}
{{- if .url }}
- --redis={{ .url }}
{{- else if .clusterUrls }}
- --redis-cluster={{ join "," .clusterUrls }}
{{- else if .sentinelUrls }}
- --redis-sentinel={{ join "," .sentinelUrls }}
- --redis-sentinel-master={{ .sentinelMaster }}
{{- end }}
{{- if .user }}
- --redis-user={{ .user }}
{{- end }}
{{- if .existingSecret }}
- --redis-password-file=/etc/floodgate/redis/password
{{- if .tls.ca }}
- --redis-ca=/etc/floodgate/redis/ca.pem
{{- end }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . }}
{{- end }}
